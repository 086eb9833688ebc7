//! The library's one error type. Instability is never an error: it is an
//! `Outcome`. An `Err` means bad input, an I/O failure or a bug.

use std::path::PathBuf;

/// The library's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Why an operation could not be done (never an instability: that is an `Outcome`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A case that parsed but cannot be run as written.
    #[error("invalid case: field `{field}`: {reason}")]
    InvalidCase {
        /// The field, as a JSON path.
        field: String,
        /// Why it cannot run.
        reason: String,
    },

    /// A case the runner rejected as written (the reason names the field):
    /// `Outcome::Rejected` where a command needs a case that runs.
    #[error("{0}")]
    Rejected(String),

    /// A command or library option out of its range.
    #[error("invalid option `{field}`: {reason}")]
    InvalidOption {
        /// The option's name.
        field: String,
        /// Why it is out of range.
        reason: String,
    },

    /// Text that is not a well-formed document of its kind.
    #[error("cannot parse {0}: {1}")]
    Parse(Document, String),

    /// A file that is not a well-formed document of its kind: the message
    /// names the kind, the file and what is wrong (a line, a tensor).
    #[error("cannot parse {document} {path}: {reason}")]
    Malformed {
        /// The kind of document it was read as.
        document: Document,
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        reason: String,
    },

    /// A dataset that cannot feed the case: missing, changed since the case
    /// pinned its hash, or shaped unlike the model's input.
    #[error("dataset {name}: {reason}")]
    Data {
        /// The dataset's name or path.
        name: String,
        /// What is wrong.
        reason: String,
    },

    /// A campaign worker process failed in a way that is not the case's
    /// doing (it could not be started, or answered nonsense).
    #[error("worker process: {0}")]
    Worker(String),

    /// A file or directory that could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The requested device cannot be opened (not compiled in, absent, ...).
    #[error("device `{device}`: {reason}")]
    Device {
        /// The device as the case names it.
        device: String,
        /// Why it cannot be opened.
        reason: String,
    },

    /// candle's message, without the backtrace candle attaches when
    /// `RUST_BACKTRACE` is set (common in CI).
    #[error("{}", candle_message(.0))]
    Candle(#[from] candle_core::Error),
}

/// What kind of file a [`Error::Malformed`] was read as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Document {
    /// A case.
    Case,
    /// A campaign journal.
    Journal,
    /// A scene or dump.
    Dump,
    /// A reproducer.
    Reproducer,
    /// A dataset file.
    Dataset,
}

impl std::fmt::Display for Document {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Document::Case => "case",
            Document::Journal => "journal",
            Document::Dump => "dump",
            Document::Reproducer => "reproducer",
            Document::Dataset => "dataset",
        })
    }
}

/// A candle error's message with every backtrace stripped.
fn candle_message(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(inner),
        candle_core::Error::Context { inner, context } => {
            format!("{context}: {}", candle_message(inner))
        }
        candle_core::Error::WithPath { inner, path } => {
            format!("{}: {}", path.display(), candle_message(inner))
        }
        other => other.to_string(),
    }
}

impl Error {
    /// An invalid case field and why.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidCase {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// An option out of its range and why.
    pub fn option(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidOption {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// A file that is not a well-formed document of its kind.
    pub fn malformed(
        document: Document,
        path: &std::path::Path,
        reason: impl Into<String>,
    ) -> Self {
        Error::Malformed {
            document,
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }

    /// A parse error of text read from `path`, as the error of that file.
    pub fn in_file(self, path: &std::path::Path) -> Self {
        match self {
            Error::Parse(document, reason) => Error::malformed(document, path, reason),
            e => e,
        }
    }

    /// A dataset that cannot feed the case, and why.
    pub fn data(name: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        Error::Data {
            name: name.to_string(),
            reason: reason.into(),
        }
    }

    /// An I/O failure at `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Whether the error comes from the input (as opposed to a bug).
    pub fn is_input_error(&self) -> bool {
        matches!(
            self,
            Error::InvalidCase { .. }
                | Error::Rejected(_)
                | Error::InvalidOption { .. }
                | Error::Parse(..)
                | Error::Malformed { .. }
                | Error::Data { .. }
                | Error::Io { .. }
                | Error::Device { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candle_errors_print_without_their_backtrace() {
        let e = candle_core::Error::Msg("shape mismatch in matmul".into()).bt();
        let e = candle_core::Error::WithBacktrace {
            inner: Box::new(e),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        };
        assert_eq!(Error::from(e).to_string(), "shape mismatch in matmul");
    }
}
