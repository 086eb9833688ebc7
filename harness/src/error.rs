//! The library's one error type. Instability is never an error: it is an
//! `Outcome`. An `Err` means bad input, an I/O failure or a bug.

use std::path::PathBuf;

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A case that parsed but cannot be run as written.
    #[error("invalid case: field `{field}`: {reason}")]
    InvalidCase { field: String, reason: String },

    /// A command or library option out of its range.
    #[error("invalid option `{field}`: {reason}")]
    InvalidOption { field: String, reason: String },

    /// A case file that is not a well-formed case document.
    #[error("cannot parse case: {0}")]
    Parse(String),

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The requested device cannot be opened (not compiled in, absent, ...).
    #[error("device `{device}`: {reason}")]
    Device { device: String, reason: String },

    /// A trainable variable received no gradient: the model's graph is broken
    /// (an op without a backward pass, or a detached parameter).
    #[error("parameter `{param}` received no gradient in backward; its op has no backward pass or it is detached")]
    MissingGradient { param: String },

    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl Error {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidCase {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub fn option(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidOption {
            field: field.into(),
            reason: reason.into(),
        }
    }

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
                | Error::InvalidOption { .. }
                | Error::Parse(_)
                | Error::Io { .. }
                | Error::Device { .. }
        )
    }
}
