//! Shared helpers: the built `nanhunt` binary and the checked-in case files.

use nanhunt::journal::{read_entries, Entry, JOURNAL_FILE};
use nanhunt::spec::OptimizerSpec;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root.
/// The pages a user reads, in reading order: the README, then the
/// reference pages under `docs/` (their code and commands are kept true
/// as the README's are).
pub const USER_PAGES: &[&str] = &[
    "README.md",
    "docs/COMMANDS.md",
    "docs/CASE-FORMAT.md",
    "docs/OWN-MODEL.md",
    "docs/HUNT.md",
    "docs/GUARD.md",
    "docs/FINDINGS.md",
    "docs/CAMPAIGNS.md",
    "docs/REPORT.md",
    "docs/LR-TABLES.md",
    "docs/DIFFERENTIAL.md",
    "docs/CUDA.md",
    "docs/FUZZ-TARGETS.md",
];

/// The text of every page of [`USER_PAGES`], in order.
pub fn user_pages() -> Vec<(&'static str, String)> {
    USER_PAGES
        .iter()
        .map(|p| (*p, std::fs::read_to_string(root().join(p)).unwrap()))
        .collect()
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn cases(sub: &str) -> PathBuf {
    root().join("tests/cases").join(sub)
}

/// The newest modification time of the files under `dir`.
fn newest_source(dir: &Path) -> std::time::SystemTime {
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let t = if path.is_dir() {
            newest_source(&path)
        } else {
            entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(newest)
        };
        newest = newest.max(t);
    }
    newest
}

/// The `nanhunt` binary of this build profile (`target/<profile>/nanhunt`).
/// `cargo test --workspace` builds it for the harness crate's own tests. A
/// run of this crate alone (`cargo test -p nanhunt-tests`) may find it older
/// than the harness sources; then the first call asks cargo to rebuild it.
pub fn binary() -> PathBuf {
    built("nanhunt", &["--bin", "nanhunt"], &["harness/src"])
}

/// The binary of one of the harness's examples (`target/<profile>/examples/NAME`),
/// built as [`binary`] is (`cargo test --workspace` builds the examples).
pub fn example_binary(name: &str) -> PathBuf {
    built(
        &format!("examples/{name}"),
        &["--example", name],
        &["harness/src", "harness/examples"],
    )
}

/// `target/<profile>/PATH`, rebuilt by cargo (with `what`) when it is
/// older than the sources under `sources` (checked once per test run).
fn built(path: &str, what: &[&str], sources: &[&str]) -> PathBuf {
    static CHECKED: std::sync::Mutex<BTreeSet<String>> = std::sync::Mutex::new(BTreeSet::new());
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let bin = profile_dir.join(format!("{path}{}", std::env::consts::EXE_SUFFIX));
    let mut checked = CHECKED.lock().unwrap_or_else(|e| e.into_inner());
    if checked.insert(path.to_string()) {
        let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
        let newest = sources
            .iter()
            .map(|s| newest_source(&root().join(s)))
            .max()
            .unwrap();
        if built.is_some_and(|b| b >= newest) {
            return bin;
        }
        let mut cargo = Command::new(env!("CARGO"));
        cargo.args(["build", "--quiet", "-p", "nanhunt"]).args(what);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cargo.arg("--release");
        }
        let status = cargo.current_dir(root()).status().expect("cargo runs");
        assert!(status.success(), "building {path} failed");
    }
    drop(checked);
    assert!(bin.exists(), "{} is missing", bin.display());
    bin
}

pub fn nanhunt(args: &[&str]) -> Output {
    Command::new(binary()).args(args).output().unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh scratch directory in the system's temporary directory, removed
/// when the test that made it passes (a run of the suite leaves nothing
/// behind) and kept, named on stderr, when it fails: its files are the
/// evidence.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept the failed test's files in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

pub fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("nanhunt-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// Plain SGD (no momentum, no weight decay).
pub fn sgd(lr: f64) -> OptimizerSpec {
    OptimizerSpec::Sgd {
        lr,
        momentum: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    }
}

/// A Python that can `import safetensors, numpy`: the machine's `python3`
/// when it has them, else `python3` with both installed by pip into the
/// target directory once (so `cargo test` needs no set-up step of its own).
pub fn python_with_safetensors() -> Command {
    static LIB: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    let has_them = |lib: Option<&Path>| {
        let mut py = Command::new("python3");
        if let Some(lib) = lib {
            py.env("PYTHONPATH", lib);
        }
        py.args(["-c", "import safetensors, numpy"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let lib = LIB.get_or_init(|| {
        if has_them(None) {
            return None;
        }
        // target/<profile>/deps/<test binary> → target/python-lib
        let exe = std::env::current_exe().unwrap();
        let lib = exe.ancestors().nth(3).unwrap().join("python-lib");
        if !has_them(Some(&lib)) {
            let status = Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .arg("--target")
                .arg(&lib)
                .args(["safetensors", "numpy"])
                .status()
                .expect("python3 runs");
            assert!(
                status.success(),
                "pip could not install safetensors and numpy"
            );
        }
        Some(lib)
    });
    let mut py = Command::new("python3");
    if let Some(lib) = lib {
        py.env("PYTHONPATH", lib);
    }
    py
}

// Campaign journals, as the campaign and crash-safety tests read them.

pub fn journal(dir: &Path) -> Vec<Entry> {
    read_entries(&dir.join(JOURNAL_FILE), false).unwrap()
}

pub fn reproducer_files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir.join("repro"))
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

pub fn signatures(entries: &[Entry]) -> BTreeSet<String> {
    entries
        .iter()
        .filter_map(|e| match e {
            Entry::Finding { signature, .. } => Some(signature.slug()),
            _ => None,
        })
        .collect()
}

/// The run entries by index, without their timings.
pub fn runs_by_index(entries: &[Entry]) -> BTreeMap<u64, Entry> {
    entries
        .iter()
        .filter_map(|e| match e {
            Entry::Run { index, .. } => {
                let mut e = e.clone();
                if let Entry::Run { millis, .. } = &mut e {
                    *millis = 0;
                }
                Some((*index, e))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_scratch_directory_goes_with_a_passing_test_and_stays_after_a_failing_one() {
    let passed = {
        let dir = scratch("scratch-passed");
        std::fs::write(dir.join("a.txt"), "x").unwrap();
        dir.to_path_buf()
    };
    assert!(!passed.exists(), "{} was left behind", passed.display());
    let failed = std::panic::catch_unwind(|| {
        let dir = scratch("scratch-failed");
        std::fs::write(dir.join("a.txt"), "x").unwrap();
        panic!("{}", dir.display());
    })
    .unwrap_err();
    let failed = PathBuf::from(failed.downcast_ref::<String>().unwrap());
    assert!(
        failed.join("a.txt").exists(),
        "{} is gone",
        failed.display()
    );
    std::fs::remove_dir_all(&failed).unwrap();
}
