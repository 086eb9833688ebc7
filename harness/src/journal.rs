//! The campaign journal: an append-only JSON-lines file, one event per line,
//! each line flushed and fsync'd before the campaign goes on. A campaign
//! killed at any moment (even SIGKILL) leaves at worst a torn last line,
//! which [`Journal::open`] drops.

use crate::error::{Error, Result};
use crate::minimize::CaseSize;
use crate::outcome::Signature;
use crate::spec::Case;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

pub const JOURNAL_FILE: &str = "journal.jsonl";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Entry {
    /// The first line: what the campaign is.
    Start {
        nanhunt_version: String,
        seed: u64,
        families: Vec<String>,
        clean_data: bool,
        shard: (u64, u64),
        #[serde(default)]
        device: String,
        /// The budget the campaign was started with (`2h`, `100 runs`).
        #[serde(default)]
        budget: String,
    },
    /// One training run.
    Run {
        index: u64,
        family: String,
        loss: String,
        optimizer: String,
        precision: String,
        device: String,
        verdict: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<Signature>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<usize>,
        lr: f64,
        millis: u64,
        /// The loss of each executed step, rounded to f32 (for the report's curves).
        #[serde(default, with = "crate::floats::vec")]
        losses: Vec<f64>,
        /// For errors and panics: what went wrong.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// A signature seen for the first time, with the case that showed it.
    Finding {
        index: u64,
        signature: Signature,
        case: Box<Case>,
    },
    /// The reproducer written for a signature.
    Reproducer {
        signature: Signature,
        file: String,
        runs_used: usize,
        before: CaseSize,
        after: CaseSize,
    },
}

pub struct Journal {
    path: PathBuf,
    file: File,
}

impl Journal {
    /// Opens (creating if needed) the journal in `dir` and returns the
    /// entries already in it. A torn last line is cut off; a malformed line
    /// before the last is an error.
    pub fn open(dir: &Path) -> Result<(Journal, Vec<Entry>)> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let path = dir.join(JOURNAL_FILE);
        let entries = if path.exists() {
            read_entries(&path, true)?
        } else {
            Vec::new()
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        Ok((Journal { path, file }, entries))
    }

    /// Appends one entry and syncs it to disk.
    pub fn append(&mut self, entry: &Entry) -> Result<()> {
        let mut line = serde_json::to_string(entry).expect("journal entries serialize");
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.sync_data())
            .map_err(|e| Error::io(&self.path, e))
    }
}

/// Reads a journal. Every complete line must be an entry; an unterminated
/// last line is a write that was cut short, and with `repair` it is removed
/// from the file so that appends continue on a line boundary.
pub fn read_entries(path: &Path, repair: bool) -> Result<Vec<Entry>> {
    let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut entries = Vec::new();
    for (i, raw) in text[..complete].split(|&b| b == b'\n').enumerate() {
        if raw.is_empty() {
            continue;
        }
        let entry = serde_json::from_slice::<Entry>(raw)
            .map_err(|e| Error::Parse(format!("{}: line {}: {e}", path.display(), i + 1)))?;
        entries.push(entry);
    }
    if complete < text.len() && repair {
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        f.set_len(complete as u64)
            .and_then(|_| f.sync_all())
            .map_err(|e| Error::io(path, e))?;
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(index: u64) -> Entry {
        Entry::Run {
            index,
            family: "cnn".into(),
            loss: "cross_entropy".into(),
            optimizer: "adam".into(),
            precision: "f32".into(),
            device: "cpu".into(),
            losses: vec![1.5, 0.25],
            verdict: "stable".into(),
            signature: None,
            step: None,
            lr: 1e-3,
            millis: 5,
            message: None,
        }
    }

    #[test]
    fn a_torn_last_line_is_dropped_and_cut_off() {
        let dir = std::env::temp_dir().join(format!("nanhunt-journal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (mut j, e) = Journal::open(&dir).unwrap();
        assert!(e.is_empty());
        j.append(&run(0)).unwrap();
        j.append(&run(1)).unwrap();
        drop(j);
        let path = dir.join(JOURNAL_FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"event":"run","index":2,"fam"#).unwrap();
        drop(f);
        let (mut j, e) = Journal::open(&dir).unwrap();
        assert_eq!(e, vec![run(0), run(1)]);
        j.append(&run(2)).unwrap();
        let (_, e) = Journal::open(&dir).unwrap();
        assert_eq!(e, vec![run(0), run(1), run(2)]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
