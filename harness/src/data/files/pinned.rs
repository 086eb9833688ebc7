//! Read what you hash: while a dataset loads, each of its files is read
//! once into memory (pinned), and every read of it — the hash, the header,
//! the streamed samples, the labels — reads those bytes, never the path
//! again. A file swapped for another under the same name while it loads,
//! or rewritten in place, is then neither hashed nor read: the run trains
//! on exactly the bytes whose SHA-256 it records. The pinned bytes count
//! toward the load's memory limit.

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The files pinned now, by path: loads on other threads may pin theirs.
static PINNED: Mutex<Vec<(PathBuf, Arc<[u8]>)>> = Mutex::new(Vec::new());

/// Files held in memory while they load; unpinned when dropped.
pub struct Pins {
    held: Vec<(PathBuf, Arc<[u8]>)>,
}

impl Pins {
    /// Reads and pins `files`.
    pub fn hold(files: &[PathBuf]) -> Result<Pins> {
        let mut held = Vec::new();
        for path in files {
            let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
            held.push((path.clone(), Arc::from(bytes)));
        }
        let mut pinned = PINNED.lock().unwrap_or_else(|e| e.into_inner());
        pinned.extend(held.iter().cloned());
        Ok(Pins { held })
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.held.iter().map(|(_, b)| b.len()).sum()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let mut pinned = PINNED.lock().unwrap_or_else(|e| e.into_inner());
        for (_, bytes) in &self.held {
            if let Some(i) = pinned.iter().position(|(_, b)| Arc::ptr_eq(b, bytes)) {
                pinned.remove(i);
            }
        }
    }
}

/// The pinned bytes of `path`, when it is pinned.
pub fn bytes(path: &Path) -> Option<Arc<[u8]>> {
    let pinned = PINNED.lock().unwrap_or_else(|e| e.into_inner());
    pinned
        .iter()
        .rev()
        .find(|(p, _)| p == path)
        .map(|(_, b)| b.clone())
}

/// A file opened for reading: its pinned bytes, or the file itself.
pub enum Opened {
    /// Its pinned bytes.
    Held(Cursor<Arc<[u8]>>),
    /// The file itself.
    File(File),
}

impl Opened {
    /// The file's length in bytes.
    pub fn len(&self, path: &Path) -> Result<u64> {
        match self {
            Opened::Held(c) => Ok(c.get_ref().len() as u64),
            Opened::File(f) => Ok(f.metadata().map_err(|e| Error::io(path, e))?.len()),
        }
    }
}

impl Read for Opened {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Opened::Held(c) => c.read(buf),
            Opened::File(f) => f.read(buf),
        }
    }
}

impl std::io::Seek for Opened {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        match self {
            Opened::Held(c) => c.seek(pos),
            Opened::File(f) => f.seek(pos),
        }
    }
}

/// Opens `path` for reading: its pinned bytes when it is pinned, else the
/// path.
pub fn open(path: &Path) -> Result<Opened> {
    match bytes(path) {
        Some(b) => Ok(Opened::Held(Cursor::new(b))),
        None => File::open(path)
            .map(Opened::File)
            .map_err(|e| Error::io(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_file_is_read_as_it_was_when_pinned_after_a_swap_or_a_rewrite() {
        let dir = std::env::temp_dir().join(format!("nanhunt-pin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.bin");
        std::fs::write(&path, b"good").unwrap();
        let pins = Pins::hold(std::slice::from_ref(&path)).unwrap();
        let read = |f: &mut Opened| {
            let mut s = String::new();
            f.read_to_string(&mut s).unwrap();
            s
        };
        // Rewritten in place (the same inode), then swapped as `mv` does.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"evil"))
            .unwrap();
        let mut a = open(&path).unwrap();
        let other = dir.join("other.bin");
        std::fs::write(&other, b"bad!").unwrap();
        std::fs::rename(&other, &path).unwrap();
        let mut b = open(&path).unwrap();
        assert_eq!((read(&mut a), read(&mut b)), ("good".into(), "good".into()));
        drop(pins);
        assert_eq!(read(&mut open(&path).unwrap()), "bad!");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
