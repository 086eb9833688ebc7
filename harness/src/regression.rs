//! Regression replay for `cargo test`: every reproducer in a directory must
//! still fail with its recorded signature. Users call [`replay_dir`] (or
//! [`assert_dir_reproduces`]) from their own test suites.

use crate::error::{Error, Result};
use crate::models::ModelFactory;
use crate::replay::{replay_reproducer, ReplayReport, ReplayVerdict};
use crate::repro::Reproducer;
use std::path::{Path, PathBuf};

/// The reproducer files of a directory, sorted by name.
pub fn reproducer_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    Ok(files)
}

/// Replays every reproducer in `dir` (built-in families, or through
/// `factory` for a user's model) and reports each.
pub fn replay_dir(
    dir: &Path,
    factory: Option<&dyn ModelFactory>,
) -> Result<Vec<(PathBuf, ReplayReport)>> {
    let mut out = Vec::new();
    for path in reproducer_files(dir)? {
        let repro = Reproducer::load(&path)?;
        let report = replay_reproducer(&repro, factory)?;
        out.push((path, report));
    }
    Ok(out)
}

/// Panics, listing each one, when a reproducer in `dir` no longer fails
/// (fixed: delete it, or keep it as a stability test with a stable case) or
/// fails differently (the signature changed: regenerate it).
pub fn assert_dir_reproduces(dir: &Path, factory: Option<&dyn ModelFactory>) {
    let reports =
        replay_dir(dir, factory).unwrap_or_else(|e| panic!("replaying {}: {e}", dir.display()));
    let broken: Vec<String> = reports
        .iter()
        .filter(|(_, r)| r.verdict != ReplayVerdict::Reproduced)
        .map(|(p, r)| format!("{}: {}", p.display(), r.message))
        .collect();
    assert!(
        broken.is_empty(),
        "{} of {} reproducers in {} did not reproduce:\n{}",
        broken.len(),
        reports.len(),
        dir.display(),
        broken.join("\n")
    );
}
