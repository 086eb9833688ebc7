//! Read what you hash: while a dataset loads, each of its files is held
//! open (pinned), and every read of it — the hash, the header, the
//! streamed samples, the labels — opens that same file again through the
//! process's descriptor (`/proc/self/fd/N` on Linux: the same inode, with
//! an offset of its own), never the path. A file swapped for another under
//! the same name while it loads (a rename) is then neither hashed nor read:
//! the run trains on exactly the bytes whose SHA-256 it records. A file
//! rewritten in place (the same inode) is not covered; elsewhere than Linux
//! the path is opened again.

use crate::error::{Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The files pinned now, by path: loads on other threads may pin theirs.
static PINNED: Mutex<Vec<(PathBuf, Arc<File>)>> = Mutex::new(Vec::new());

/// Files held open while they load; unpinned when dropped.
pub struct Pins {
    held: Vec<(PathBuf, Arc<File>)>,
}

impl Pins {
    /// Opens and pins `files`.
    pub fn hold(files: &[PathBuf]) -> Result<Pins> {
        let mut held = Vec::new();
        for path in files {
            let file = File::open(path).map_err(|e| Error::io(path, e))?;
            held.push((path.clone(), Arc::new(file)));
        }
        let mut pinned = PINNED.lock().unwrap_or_else(|e| e.into_inner());
        pinned.extend(held.iter().cloned());
        Ok(Pins { held })
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let mut pinned = PINNED.lock().unwrap_or_else(|e| e.into_inner());
        for (_, file) in &self.held {
            if let Some(i) = pinned.iter().position(|(_, f)| Arc::ptr_eq(f, file)) {
                pinned.remove(i);
            }
        }
    }
}

/// Opens `path` for reading: the pinned file when it is pinned, with an
/// offset of its own; else the path.
pub fn open(path: &Path) -> Result<File> {
    let pin = {
        let pinned = PINNED.lock().unwrap_or_else(|e| e.into_inner());
        pinned
            .iter()
            .rev()
            .find(|(p, _)| p == path)
            .map(|(_, f)| f.clone())
    };
    match pin {
        Some(file) => reopen(&file).map_err(|e| Error::io(path, e)),
        None => File::open(path).map_err(|e| Error::io(path, e)),
    }
}

#[cfg(target_os = "linux")]
fn reopen(file: &File) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    File::open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

#[cfg(not(target_os = "linux"))]
fn reopen(file: &File) -> std::io::Result<File> {
    // One offset shared with the pin: readers here read one at a time.
    use std::io::Seek;
    let mut f = file.try_clone()?;
    f.rewind()?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_pinned_file_is_read_as_it_was_when_pinned_after_a_swap() {
        let dir = std::env::temp_dir().join(format!("nanhunt-pin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.bin");
        std::fs::write(&path, b"good").unwrap();
        let pins = Pins::hold(std::slice::from_ref(&path)).unwrap();
        // Swapped under the same name, as `mv` does.
        let other = dir.join("other.bin");
        std::fs::write(&other, b"bad!").unwrap();
        std::fs::rename(&other, &path).unwrap();
        let read = |f: &mut File| {
            let mut s = String::new();
            f.read_to_string(&mut s).unwrap();
            s
        };
        let (mut a, mut b) = (open(&path).unwrap(), open(&path).unwrap());
        assert_eq!((read(&mut a), read(&mut b)), ("good".into(), "good".into()));
        drop(pins);
        assert_eq!(read(&mut open(&path).unwrap()), "bad!");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
