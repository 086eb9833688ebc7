//! Regression replay for `cargo test`: every reproducer in a directory must
//! still fail with its recorded signature. A reproducer is a case file
//! (`*.json`, from `minimize` and campaigns) or a scene directory (a crash
//! dump, a hunt's trigger: `DIR/scene.json`). Users call [`replay_dir`] (or
//! [`assert_dir_reproduces`]) from their own test suites.

use crate::error::{Error, Result};
use crate::models::ModelFactory;
use crate::replay::{replay_case, replay_scene, ReplayReport, ReplayVerdict};
use crate::repro::Reproducer;
use crate::runner::RunOptions;
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

/// The scene directories in a directory (its subdirectories holding a
/// scene), sorted by name.
pub fn scene_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join(crate::scene::SCENE_FILE).is_file())
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// Replays every reproducer in `dir` (built-in families, or through
/// `factory` for a user's model, with the dataset or loss closure `opts`
/// carries) and reports each: the case files first, then the scenes.
pub fn replay_dir(
    dir: &Path,
    factory: Option<&dyn ModelFactory>,
    opts: &RunOptions,
) -> Result<Vec<(PathBuf, ReplayReport)>> {
    let mut out = Vec::new();
    for path in reproducer_files(dir)? {
        let repro = Reproducer::load(&path)?;
        let report = replay_case(&repro, factory, opts)?;
        out.push((path, report));
    }
    for path in scene_dirs(dir)? {
        let report = replay_scene(&path, factory, opts)?;
        out.push((path, report));
    }
    Ok(out)
}

/// Panics, listing each one, when a reproducer in `dir` no longer fails
/// (fixed: delete it, or keep it as a stability test with a stable case) or
/// fails differently (the signature changed: regenerate it).
///
/// ```no_run
/// #[test]
/// fn stability_regressions() {
///     nanhunt::regression::assert_dir_reproduces("corpora/repro".as_ref(), None);
/// }
/// ```
pub fn assert_dir_reproduces(dir: &Path, factory: Option<&dyn ModelFactory>) {
    let reports = replay_dir(dir, factory, &RunOptions::default())
        .unwrap_or_else(|e| panic!("replaying {}: {e}", dir.display()));
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
