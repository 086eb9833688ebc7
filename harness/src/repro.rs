//! Reproducers: a (minimized) failing case with its expected outcome and
//! where it came from. Teams check them into `corpora/repro/` and replay them
//! in `cargo test`.

use crate::error::{Error, Result};
use crate::finding::Signature;
use crate::spec::Case;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The reproducer format this build reads and writes.
pub const REPRO_FORMAT: u32 = 1;

/// A checked-in failing case: the case, the signature it must keep giving, where it came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reproducer {
    /// Format version: [`REPRO_FORMAT`].
    pub format: u32,
    /// The minimized case.
    pub case: Case,
    /// What it must keep producing.
    pub expected: Expected,
    /// Where it came from.
    #[serde(default)]
    pub provenance: Provenance,
}

/// The outcome a reproducer must keep producing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expected {
    /// The signature.
    pub signature: Signature,
    /// The step of the failure when the reproducer was written.
    pub step: usize,
}

/// Where a reproducer came from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// The version that wrote it.
    pub nanhunt_version: String,
    /// The case before minimization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<Case>,
    /// Training runs the minimizer spent.
    #[serde(default)]
    pub runs_used: usize,
    /// Free-form origin: a campaign, a libFuzzer artifact, a hand-written case.
    #[serde(default)]
    pub source: String,
    /// The dataset samples the case keeps, in words ("samples 1207 and
    /// 5531 of train.safetensors"), when it draws from a dataset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<String>,
}

impl Reproducer {
    /// Parses a reproducer.
    pub fn from_json(text: &str) -> Result<Reproducer> {
        let r: Reproducer = serde_json::from_str(text)
            .map_err(|e| Error::Parse(crate::error::Document::Reproducer, e.to_string()))?;
        if r.format != REPRO_FORMAT {
            return Err(Error::invalid(
                "format",
                format!(
                    "reproducer format {} is not supported (this build reads {REPRO_FORMAT})",
                    r.format
                ),
            ));
        }
        Ok(r)
    }

    /// Reads a reproducer; a relative dataset path in its case is relative
    /// to the reproducer's directory.
    pub fn load(path: &Path) -> Result<Reproducer> {
        let text = crate::files::read_text(path)?;
        let mut r = Reproducer::from_json(&text).map_err(|e| e.in_file(path))?;
        let dir = path.parent().unwrap_or(Path::new(""));
        r.case.resolve_paths(dir);
        if let Some(original) = &mut r.provenance.original {
            original.resolve_paths(dir);
        }
        Ok(r)
    }

    /// The reproducer as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a reproducer always serializes")
    }

    /// The JSON of the reproducer as a file in `dir`: dataset paths
    /// relative to `dir`.
    pub fn to_json_in(&self, dir: &Path) -> String {
        let mut r = self.clone();
        r.case = r.case.with_paths_relative_to(dir);
        if let Some(original) = &mut r.provenance.original {
            *original = original.with_paths_relative_to(dir);
        }
        r.to_json()
    }

    /// Writes the reproducer to `path` atomically.
    pub fn write(&self, path: &Path) -> Result<()> {
        let dir = path.parent().unwrap_or(Path::new(""));
        crate::files::write_atomic(path, self.to_json_in(dir).as_bytes())
    }
}
