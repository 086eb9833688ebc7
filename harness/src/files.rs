//! Reading and writing the files nanhunt depends on, safely: reads are of
//! regular files only and bounded in size (a case path that names
//! `/dev/zero` or a FIFO is an error, not a hang), and writes are atomic (a
//! temp file in the same directory, synced, then renamed), with the temp file
//! removed when a write fails. Temp files are named `.NAME.tmp-PID`, so the
//! ones a killed process left behind can be found and removed.

use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The largest case, reproducer or stats file read (cases are a few KB).
pub const MAX_DOCUMENT_BYTES: u64 = 16 << 20;

/// Reads a regular file of at most `max` bytes.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file (a directory, device or pipe)",
            ),
        ));
    }
    let too_large = || {
        Error::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("larger than the limit of {} MiB", max >> 20),
            ),
        )
    };
    if meta.len() > max {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_end(&mut bytes))
        .map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > max {
        return Err(too_large()); // it grew while we read
    }
    Ok(bytes)
}

/// Reads a regular UTF-8 text file of at most [`MAX_DOCUMENT_BYTES`].
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = read_bounded(path, MAX_DOCUMENT_BYTES)?;
    String::from_utf8(bytes).map_err(|_| {
        Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"),
        )
    })
}

/// The temp file (or directory) beside `path` that an atomic write fills
/// first: `.NAME.tmp-PID`.
pub fn temp_path(path: &Path) -> PathBuf {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.join(format!(".{name}{TEMP_MARK}{}", std::process::id()))
}

const TEMP_MARK: &str = ".tmp-";

/// Writes `bytes` to `path` atomically (temp file in the same directory +
/// fsync + rename); on failure the temp file is removed, and so are the
/// temp files of this path that killed writers left.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let target = path.file_name().map(|n| n.to_string_lossy().into_owned());
    remove_stale(dir, |of, owner| {
        target.as_deref() == Some(of) && !process_exists(owner)
    });
    let tmp = temp_path(path);
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .map_err(|e| Error::io(&tmp, e))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Checks, before long work, that `path` can be written later: its
/// directory exists or can be made, it is not a directory, and a file can be
/// created beside it.
pub fn check_writable(path: &Path) -> Result<()> {
    if path.is_dir() {
        return Err(Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::IsADirectory, "is a directory"),
        ));
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let probe = temp_path(path);
    std::fs::File::create(&probe).map_err(|e| Error::io(dir, e))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Removes the temp files in `dir` that a process no longer writing left
/// behind: those of `pid` if given, else those whose process is gone (a
/// kill interrupted its write). Returns how many were removed.
pub fn remove_stale_temps(dir: &Path, pid: Option<u32>) -> usize {
    remove_stale(dir, |_, owner| match pid {
        Some(p) => owner == p,
        None => !process_exists(owner),
    })
}

/// Removes every temp file in `dir` but this process's: for a caller that
/// holds the directory's lock, so that no live writer is left outside it.
/// A killed writer's orphaned children can still exist for a moment (a
/// zombie answers signal 0), which [`remove_stale_temps`] would spare.
pub fn remove_foreign_temps(dir: &Path) -> usize {
    let me = std::process::id();
    remove_stale(dir, |_, owner| owner != me)
}

/// Removes the temp files in `dir` for which `stale(the file it is a temp
/// of, its writer's pid)` holds.
fn remove_stale(dir: &Path, stale: impl Fn(&str, u32) -> bool) -> usize {
    let Ok(read) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in read.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((of, owner)) = name
            .strip_prefix('.')
            .and_then(|n| n.rsplit_once(TEMP_MARK))
            .and_then(|(of, owner)| Some((of, owner.parse::<u32>().ok()?)))
        else {
            continue;
        };
        if !stale(of, owner) {
            continue;
        }
        let path = entry.path();
        let gone = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed += usize::from(gone.is_ok());
    }
    removed
}

/// Whether a process with this id runs (on other platforms: assume it
/// does). A zombie — a killed worker its parent has not reaped yet, for
/// the second or so it lingers — exists for `kill(pid, 0)` but writes
/// nothing: on Linux its state in `/proc/PID/stat` says so.
fn process_exists(pid: u32) -> bool {
    #[cfg(target_os = "linux")]
    if zombie(pid) {
        return false;
    }
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: signal 0 only checks that the process exists.
        let sent = unsafe { libc::kill(pid, 0) };
        sent == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// Whether `/proc/PID/stat` gives the process the state Z (a zombie) or X
/// (dead). The state follows the command name's closing parenthesis,
/// which may itself hold spaces and parentheses.
#[cfg(target_os = "linux")]
fn zombie(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    matches!(state, Some("Z" | "X"))
}

/// `path` without `.` components and with `a/..` pairs removed (lexically:
/// symbolic links are not followed).
pub fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// `path` as seen from `dir` (`../data/x.safetensors`), where both lie
/// under one directory below the root; else `path` made absolute.
pub fn relative_to(path: &Path, dir: &Path) -> PathBuf {
    let (Ok(path), Ok(dir)) = (std::path::absolute(path), std::path::absolute(dir)) else {
        return path.to_path_buf();
    };
    let (path, dir) = (normalize(&path), normalize(&dir));
    let (p, d): (Vec<_>, Vec<_>) = (path.components().collect(), dir.components().collect());
    let common = p.iter().zip(&d).take_while(|(a, b)| a == b).count();
    // Sharing only the root, the two are on unrelated trees.
    if common <= 1 {
        return path;
    }
    let mut out = PathBuf::new();
    for _ in common..d.len() {
        out.push("..");
    }
    for c in &p[common..] {
        out.push(c.as_os_str());
    }
    out
}

/// Writes `bytes` to a new file at `path` and syncs it to disk.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).map_err(|e| Error::io(path, e))?;
    f.sync_all().map_err(|e| Error::io(path, e))
}

/// Makes directory `dir` (which must not exist) atomically: `fill` writes
/// its files into a temporary sibling, which is renamed into place, so the
/// directory is either complete or absent. What a killed write left beside
/// it is removed first.
pub fn write_dir_atomic(dir: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    beside(
        dir,
        |tmp| {
            std::fs::create_dir(tmp).map_err(|e| Error::io(tmp, e))?;
            fill(tmp)
        },
        |tmp| std::fs::rename(tmp, dir).map_err(|e| Error::io(dir, e)),
    )
}

/// `fill`s the temp sibling of `dir`, then `place`s it; what a killed
/// writer left beside `dir` is removed first, and the temp sibling on
/// failure.
fn beside(
    dir: &Path,
    fill: impl FnOnce(&Path) -> Result<()>,
    place: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    remove_stale_temps(parent, None);
    let tmp = temp_path(dir);
    let _ = std::fs::remove_dir_all(&tmp);
    let written = fill(&tmp).and_then(|()| place(&tmp));
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    written
}

/// Writes directory `dir` whole, replacing any earlier one: `fill` makes a
/// temp sibling (the path it is given, which does not exist), which then
/// takes `dir`'s place ([`replace_dir`]).
/// At every instant `dir` is the earlier complete directory or the new one.
pub fn replace_dir_atomic(dir: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    beside(dir, fill, |tmp| {
        abort_at(ReplacePoint::Filled);
        replace_dir(tmp, dir)
    })
}

/// Fault injection for the kill tests: the process aborts at this point
/// of a directory's replacement (`filled`, `exchanged`, `removing`).
pub const ABORT_IN_REPLACE_ENV: &str = "NANHUNT_ABORT_IN_REPLACE";

/// Where a replacement can be killed between its writes.
#[derive(Clone, Copy, PartialEq, Debug)]
enum ReplacePoint {
    /// The new directory complete under its temp name.
    Filled,
    /// The two exchanged: the old one under the temp name.
    Exchanged,
    /// The old one half removed.
    Removing,
}

fn abort_at(point: ReplacePoint) {
    let name = match point {
        ReplacePoint::Filled => "filled",
        ReplacePoint::Exchanged => "exchanged",
        ReplacePoint::Removing => "removing",
    };
    if std::env::var(ABORT_IN_REPLACE_ENV).is_ok_and(|v| v == name) {
        std::process::abort();
    }
}

/// Removes the directory `dir` (an earlier copy under a temp name).
fn remove_old(dir: &Path) -> Result<()> {
    if std::env::var(ABORT_IN_REPLACE_ENV).is_ok_and(|v| v == "removing") {
        // Half removed: its first file gone.
        if let Some(Ok(first)) = std::fs::read_dir(dir).ok().and_then(|mut r| r.next()) {
            let _ = std::fs::remove_file(first.path());
        }
        abort_at(ReplacePoint::Removing);
    }
    std::fs::remove_dir_all(dir).map_err(|e| Error::io(dir, e))
}

/// Puts the complete directory `from` (on `dir`'s file system) in `dir`'s
/// place. An earlier `dir` is exchanged with it in one rename (Linux's
/// `RENAME_EXCHANGE`) and then removed from `from`'s name; elsewhere it is
/// moved aside to a temp name first. A kill at any point leaves `dir`
/// complete, old or new, and at most a temp name that the next writer
/// removes.
pub fn replace_dir(from: &Path, dir: &Path) -> Result<()> {
    if std::fs::symlink_metadata(dir).is_err() {
        return std::fs::rename(from, dir).map_err(|e| Error::io(dir, e));
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes());
        let (Ok(a), Ok(b)) = (c(from), c(dir)) else {
            return Err(Error::io(
                dir,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL in the path"),
            ));
        };
        // SAFETY: two NUL-terminated paths that outlive the call.
        let swapped = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        } == 0;
        if swapped {
            // `from` now names the earlier directory.
            abort_at(ReplacePoint::Exchanged);
            return remove_old(from);
        }
        // A file system without the exchange: the rename below.
    }
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let aside = temp_path(&dir.with_file_name(format!("{name}.old")));
    let _ = std::fs::remove_dir_all(&aside);
    std::fs::rename(dir, &aside).map_err(|e| Error::io(dir, e))?;
    std::fs::rename(from, dir).map_err(|e| Error::io(dir, e))?;
    abort_at(ReplacePoint::Exchanged);
    remove_old(&aside)
}

#[cfg(test)]
mod tests {
    #[cfg(target_os = "linux")]
    #[test]
    fn a_zombie_is_no_live_writer() {
        // A child that has exited and is not reaped yet is a zombie.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !super::zombie(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(super::zombie(pid), "pid {pid} never became a zombie");
        assert!(!super::process_exists(pid));
        child.wait().unwrap();
        assert!(super::process_exists(std::process::id()));
        assert!(!super::zombie(std::process::id()));
    }

    use super::*;

    #[test]
    fn a_directory_is_replaced_whole_or_not_at_all() {
        let root = std::env::temp_dir().join(format!("nanhunt-replace-{}", std::process::id()));
        let dir = root.join("repro.a-b");
        let _ = std::fs::remove_dir_all(&root);
        let fill = |text: &'static str| {
            move |d: &Path| {
                std::fs::create_dir(d).unwrap();
                write_synced(&d.join("scene.json"), text.as_bytes())
            }
        };
        replace_dir_atomic(&dir, fill("old")).unwrap();
        replace_dir_atomic(&dir, fill("new")).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("scene.json")).unwrap(),
            "new"
        );
        // A fill that fails leaves the earlier directory as it was.
        let failed = replace_dir_atomic(&dir, |d| {
            std::fs::create_dir(d).unwrap();
            write_synced(&d.join("scene.json"), b"half")?;
            Err(Error::invalid("fill", "killed half way"))
        });
        assert!(failed.is_err());
        assert_eq!(
            std::fs::read_to_string(dir.join("scene.json")).unwrap(),
            "new"
        );
        let names: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["repro.a-b"]);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn paths_are_rebased_between_documents() {
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(normalize(&p("a/./b/../c")), p("a/c"));
        assert_eq!(
            relative_to(&p("/w/data/x.st"), &p("/w/out/repro")),
            p("../../data/x.st")
        );
        assert_eq!(relative_to(&p("/w/x.st"), &p("/w")), p("x.st"));
        // Only the root in common: absolute.
        assert_eq!(relative_to(&p("/w/x.st"), &p("/tmp/out")), p("/w/x.st"));
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nanhunt-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn reads_are_bounded_and_of_regular_files_only() {
        let dir = scratch("read");
        let file = dir.join("a.json");
        std::fs::write(&file, b"0123456789").unwrap();
        assert_eq!(read_bounded(&file, 10).unwrap(), b"0123456789");
        let e = read_bounded(&file, 9).unwrap_err().to_string();
        assert!(
            e.contains("a.json") && e.contains("larger than the limit"),
            "{e}"
        );
        let e = read_bounded(&dir, 100).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        #[cfg(unix)]
        {
            let e = read_bounded(Path::new("/dev/zero"), 100)
                .unwrap_err()
                .to_string();
            assert!(e.contains("/dev/zero: not a regular file"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn atomic_writes_leave_no_temp_file_and_stale_temps_are_removed() {
        let dir = scratch("write");
        write_atomic(&dir.join("x.json"), b"{}").unwrap();
        // A rename onto a directory fails: the temp file goes too.
        std::fs::create_dir(dir.join("taken")).unwrap();
        std::fs::write(dir.join("taken/inside"), b"").unwrap();
        assert!(write_atomic(&dir.join("taken"), b"{}").is_err());
        let names = |d: &Path| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&dir), ["taken", "x.json"]);
        // A killed writer's temp file of x.json goes with the next write of it.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        std::fs::write(dir.join(format!(".x.json.tmp-{gone}")), b"half").unwrap();
        write_atomic(&dir.join("x.json"), b"{}").unwrap();
        #[cfg(unix)]
        assert_eq!(names(&dir), ["taken", "x.json"]);
        // What a process left: the given pid's; then those of processes
        // that are gone, never a live one's.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        std::fs::write(dir.join(".a.json.tmp-11"), b"").unwrap();
        std::fs::write(dir.join(format!(".b.json.tmp-{dead}")), b"").unwrap();
        std::fs::write(dir.join(format!(".c.json.tmp-{me}")), b"").unwrap();
        std::fs::write(dir.join(".keep.tmp-me"), b"").unwrap();
        assert_eq!(remove_stale_temps(&dir, Some(11)), 1);
        #[cfg(unix)]
        assert_eq!(remove_stale_temps(&dir, None), 1);
        assert_eq!(
            names(&dir),
            [
                format!(".c.json.tmp-{me}").as_str(),
                ".keep.tmp-me",
                "taken",
                "x.json"
            ]
        );
        // A lock holder removes every other writer's, a live one's too.
        std::fs::write(dir.join(".d.json.tmp-1"), b"").unwrap();
        assert_eq!(remove_foreign_temps(&dir), 1);
        assert!(names(&dir).contains(&format!(".c.json.tmp-{me}")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
