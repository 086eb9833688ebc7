//! The campaign journal: an append-only JSON-lines file, one event per line,
//! each append flushed and fsync'd before the campaign goes on. A campaign
//! killed at any moment (even SIGKILL) leaves at worst a torn tail, which
//! [`Journal::open`] cuts off.
//!
//! Entries that belong together are appended as one group in one write: the
//! run that shows a new signature and its `finding`. A kill can still cut
//! that write short (the kernel may stop a multi-page write at a fatal
//! signal), so `open` also cuts a run whose new signature has no finding
//! after it: the run is redone on resume, from the same campaign state.

use crate::error::{Error, Result};
use crate::finding::{Signature, Verdict};
use crate::record::RunResult;
use crate::spec::Case;
use crate::spec::CaseSize;
use crate::strategy::ModelScale;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The journal's file name in a campaign directory.
pub const JOURNAL_FILE: &str = "journal.jsonl";
/// The lock file beside the journal (see [`Journal::open`]).
pub const LOCK_FILE: &str = ".lock";

/// The share of a campaign's runs that mutate a case found earlier (the
/// rest are fresh draws), unless `fuzz --mutation-rate` says otherwise.
pub const DEFAULT_MUTATION_RATE: f64 = 0.25;

fn default_mutation_rate() -> f64 {
    DEFAULT_MUTATION_RATE
}

fn is_default_mutation_rate(rate: &f64) -> bool {
    *rate == DEFAULT_MUTATION_RATE
}

/// One line of the journal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Entry {
    /// The first line: what the campaign is.
    Start {
        /// The version that started the campaign.
        nanhunt_version: String,
        /// The campaign seed.
        seed: u64,
        /// The families it draws from.
        families: Vec<String>,
        /// Whether the data pathologies are off.
        clean_data: bool,
        /// This shard's (index, count).
        shard: (u64, u64),
        /// The device its runs train on.
        #[serde(default)]
        device: String,
        /// The budget the campaign was started with (`2h`, `100 runs`).
        #[serde(default)]
        budget: String,
        /// The dataset every case trains on (`path sha256`), if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        /// The share of runs that mutate an earlier finding (journals from
        /// before the option hold the default, which is left unwritten).
        #[serde(
            default = "default_mutation_rate",
            skip_serializing_if = "is_default_mutation_rate"
        )]
        mutation_rate: f64,
        /// The scale of the models drawn (journals from before the option,
        /// and small campaigns, leave it unwritten).
        #[serde(default, skip_serializing_if = "ModelScale::is_small")]
        size: ModelScale,
    },
    /// One training run.
    Run {
        /// The run's index in the campaign.
        index: u64,
        /// The model family.
        family: String,
        /// The loss's name.
        loss: String,
        /// The optimizer's name.
        optimizer: String,
        /// The precision's name.
        precision: String,
        /// The device.
        device: String,
        /// How it ended.
        verdict: Verdict,
        /// An unstable run's signature.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<Signature>,
        /// An unstable run's failing step.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<usize>,
        /// An unstable run's precision check verdict.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fidelity: Option<crate::finding::Robustness>,
        /// An unstable run's explained pattern at its producing stage.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pattern: Option<crate::finding::Pattern>,
        /// The base learning rate.
        lr: f64,
        /// Wall time of the run.
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
        /// The run that showed it.
        index: u64,
        /// The signature.
        signature: Signature,
        /// The run's case.
        case: Box<Case>,
    },
    /// The reproducer written for a signature.
    Reproducer {
        /// The signature.
        signature: Signature,
        /// The reproducer's file, relative to the campaign directory.
        file: String,
        /// Runs the minimizer spent.
        runs_used: usize,
        /// The case's size before.
        before: CaseSize,
        /// The reproducer's size.
        after: CaseSize,
    },
    /// A minimization of a signature that ended without a reproducer.
    Unminimized {
        /// The signature.
        signature: Signature,
        /// Why.
        reason: Unminimized,
        /// What happened.
        message: String,
    },
    /// The signatures a session reported as new: it exited 1 for them.
    /// Signatures found but in no such entry (their session was killed)
    /// are reported by the next session that ends.
    Reported {
        /// The signatures' slugs.
        signatures: Vec<String>,
    },
}

/// Why a minimization left no reproducer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unminimized {
    /// The finding did not come back when its case was run from the start.
    NotReproducible,
    /// The worker process died while minimizing (tried again up to
    /// [`MINIMIZE_ATTEMPTS`] times).
    WorkerDied,
    /// The minimization ran past its time limit and its worker was killed.
    Timeout,
}

/// How many times a signature's minimization is started before a campaign
/// gives up on it (a case that kills its worker every time, say).
pub const MINIMIZE_ATTEMPTS: usize = 2;

impl Unminimized {
    /// Whether trying again may help.
    pub fn retryable(self) -> bool {
        self == Unminimized::WorkerDied
    }
}

impl Entry {
    /// The `run` entry of campaign run `index` of `case`.
    pub fn run(index: u64, case: &Case, record: RunResult, millis: u64) -> Entry {
        let RunResult {
            verdict,
            signature,
            step,
            losses,
            message,
            fidelity,
            pattern,
        } = record;
        Entry::Run {
            index,
            family: case.family().to_string(),
            loss: case.loss.name().to_string(),
            optimizer: case.optimizer.name().to_string(),
            precision: case.precision.name().to_string(),
            device: case.device.to_string(),
            verdict,
            signature,
            step,
            fidelity,
            pattern,
            lr: case.optimizer.lr(),
            millis,
            losses,
            message,
        }
    }
}

/// The run entries of a journal, each run index once (merged shards may
/// repeat a run; its first entry counts). Every view of a journal (the
/// summary, the report) counts runs through this.
pub fn runs_once(entries: &[Entry]) -> impl Iterator<Item = &Entry> {
    let mut seen = BTreeSet::new();
    entries.iter().filter(move |e| match e {
        Entry::Run { index, .. } => seen.insert(*index),
        _ => false,
    })
}

/// Per signature (slug), the reproducer a journal names for it: the
/// smallest file name, when there are several (merged shards).
pub fn reproducers(entries: &[Entry]) -> BTreeMap<String, String> {
    let mut best: BTreeMap<String, String> = BTreeMap::new();
    for e in entries {
        if let Entry::Reproducer {
            signature, file, ..
        } = e
        {
            let slot = best.entry(signature.slug()).or_insert_with(|| file.clone());
            if file < slot {
                *slot = file.clone();
            }
        }
    }
    best
}

/// What identifies a campaign in its start line: a journal resumed, or
/// shards merged, must agree on all of it.
#[derive(Clone, Debug, PartialEq)]
pub struct CampaignId {
    /// The campaign seed.
    pub seed: u64,
    /// The families it draws from.
    pub families: Vec<String>,
    /// Whether the data pathologies are off.
    pub clean_data: bool,
    /// The dataset every case trains on, if any.
    pub data: Option<String>,
    /// The share of runs that mutate an earlier finding.
    pub mutation_rate: f64,
    /// The scale of the models drawn.
    pub size: ModelScale,
    /// (index, count).
    pub shard: (u64, u64),
}

impl CampaignId {
    /// The campaign a start line names; `None` for any other entry.
    pub fn of(entry: &Entry) -> Option<CampaignId> {
        match entry {
            Entry::Start {
                seed,
                families,
                clean_data,
                shard,
                data,
                mutation_rate,
                size,
                ..
            } => Some(CampaignId {
                seed: *seed,
                families: families.clone(),
                clean_data: *clean_data,
                data: data.clone(),
                mutation_rate: *mutation_rate,
                size: *size,
                shard: *shard,
            }),
            _ => None,
        }
    }

    /// How `other` differs from this campaign, in words ("seed 6 (not
    /// 2)"); the shard index is compared only with `index`.
    pub fn differences(&self, other: &CampaignId, index: bool) -> Vec<String> {
        let mut said = Vec::new();
        let mut differ = |same: bool, text: String| {
            if !same {
                said.push(text);
            }
        };
        differ(
            self.seed == other.seed,
            format!("seed {} (not {})", other.seed, self.seed),
        );
        differ(
            self.families == other.families,
            format!(
                "families or model {:?} (not {:?})",
                other.families, self.families
            ),
        );
        differ(
            self.clean_data == other.clean_data,
            format!("clean data {} (not {})", other.clean_data, self.clean_data),
        );
        let data = |d: &Option<String>| d.clone().unwrap_or_else(|| "generated".into());
        differ(
            self.data == other.data,
            format!("data {} (not {})", data(&other.data), data(&self.data)),
        );
        differ(
            self.mutation_rate == other.mutation_rate,
            format!(
                "mutation rate {} (not {})",
                other.mutation_rate, self.mutation_rate
            ),
        );
        differ(
            self.size == other.size,
            format!("size {} (not {})", other.size.name(), self.size.name()),
        );
        let (i, n) = other.shard;
        differ(
            self.shard.1 == n && (!index || self.shard.0 == i),
            format!(
                "shard {i} of {n} (not {} of {})",
                self.shard.0, self.shard.1
            ),
        );
        said
    }
}

/// An open, locked campaign journal: appends are fsync'd whole lines.
pub struct Journal {
    path: PathBuf,
    file: File,
    /// Held while the journal is open.
    _lock: File,
    /// The journal's and the lock's identities as opened, checked before
    /// each append: a directory deleted or replaced under the campaign
    /// stops it instead of taking appends into an unlinked file.
    identity: [Option<FileId>; 2],
}

/// A file's device and inode.
type FileId = (u64, u64);

/// The identity of the file at `path` (`None` where there is none, or
/// off Unix, where nothing is checked).
fn file_id(path: &Path) -> Option<FileId> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

impl Journal {
    /// Opens (creating if needed) the journal in `dir`, locked against any
    /// other process, and returns the entries already in it. What a kill
    /// left unfinished is cut off; a malformed line before the last is an error.
    pub fn open(dir: &Path) -> Result<(Journal, Vec<Entry>)> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let lock = lock_dir(dir)?;
        let path = dir.join(JOURNAL_FILE);
        let entries = if path.exists() {
            read_repaired(&path)?
        } else {
            Vec::new()
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        let identity = [file_id(&path), file_id(&dir.join(LOCK_FILE))];
        Ok((
            Journal {
                path,
                file,
                _lock: lock,
                identity,
            },
            entries,
        ))
    }

    /// Appends one entry and syncs it to disk.
    pub fn append(&mut self, entry: &Entry) -> Result<()> {
        self.append_group(std::slice::from_ref(entry))
    }

    /// Checks that the journal and its lock are still the files this
    /// process opened: an error (the directory was deleted or replaced)
    /// means the campaign must stop and write nothing more.
    pub fn check_in_place(&self) -> Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let now = [file_id(&self.path), file_id(&dir.join(LOCK_FILE))];
        if now == self.identity {
            return Ok(());
        }
        Err(Error::io(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the campaign directory was deleted or replaced while the campaign ran: it stopped, writing nothing more",
            ),
        ))
    }

    /// Appends entries that belong together in one write, then syncs.
    pub fn append_group(&mut self, entries: &[Entry]) -> Result<()> {
        self.check_in_place()?;
        self.file
            .write_all(lines(entries).as_bytes())
            .and_then(|_| self.file.sync_data())
            .map_err(|e| Error::io(&self.path, e))
    }
}

/// Entries as journal lines, one JSON object each.
pub fn lines(entries: &[Entry]) -> String {
    let mut text = String::new();
    for entry in entries {
        text.push_str(&serde_json::to_string(entry).expect("journal entries serialize"));
        text.push('\n');
    }
    text
}

/// Takes an output directory for this process: its lock (as
/// [`lock_dir`]), then every other writer's temp file in it and in
/// `inner` removed (a killed one's). The lock is held while the file is.
pub fn take_dir(dir: &Path, inner: &[&Path]) -> Result<File> {
    let lock = lock_dir(dir)?;
    for d in std::iter::once(dir).chain(inner.iter().copied()) {
        crate::files::remove_foreign_temps(d);
    }
    Ok(lock)
}

/// Takes the lock of an output directory (`.lock`), so that one process
/// at a time writes it — a campaign, a merge or a hunt; released when the
/// process ends, however it ends.
pub fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a file descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(Error::io(
                dir,
                std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    "another nanhunt process is writing this output directory",
                ),
            ));
        }
    }
    Ok(file)
}

/// The largest journal read back (a 2-hour campaign writes a few MB).
pub const MAX_JOURNAL_BYTES: u64 = 1 << 30;

/// Reads a journal and cuts off what a kill left unfinished: a torn last
/// line, and a run whose new signature lacks its finding (see the module docs).
fn read_repaired(path: &Path) -> Result<Vec<Entry>> {
    let (mut entries, mut complete, len) = parse(path)?;
    let found: BTreeSet<String> = entries
        .iter()
        .filter_map(|(_, e)| match e {
            Entry::Finding { signature, .. } => Some(signature.slug()),
            _ => None,
        })
        .collect();
    if let Some((
        offset,
        Entry::Run {
            signature: Some(sig),
            ..
        },
    )) = entries.last()
    {
        if !found.contains(&sig.slug()) {
            complete = *offset;
            entries.pop();
        }
    }
    if complete < len {
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        f.set_len(complete)
            .and_then(|_| f.sync_all())
            .map_err(|e| Error::io(path, e))?;
    }
    Ok(entries.into_iter().map(|(_, e)| e).collect())
}

/// Reads a journal. Every complete line must be an entry; an unterminated
/// last line is a write that was cut short and is left out. With `repair`,
/// what a kill left unfinished is also cut off the file, so that appends
/// continue on a complete group.
pub fn read_entries(path: &Path, repair: bool) -> Result<Vec<Entry>> {
    if repair {
        return read_repaired(path);
    }
    Ok(parse(path)?.0.into_iter().map(|(_, e)| e).collect())
}

/// The entries with the byte offset of each line, the length of the
/// complete lines, and the file's length.
#[allow(clippy::type_complexity)]
fn parse(path: &Path) -> Result<(Vec<(u64, Entry)>, u64, u64)> {
    let text = crate::files::read_bounded(path, MAX_JOURNAL_BYTES)?;
    let malformed = |line: usize, reason: String| Error::Malformed {
        document: crate::error::Document::Journal,
        path: path.to_path_buf(),
        reason: format!("line {line}: {reason}"),
    };
    let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut entries = Vec::new();
    let mut offset = 0u64;
    for (i, raw) in text[..complete].split(|&b| b == b'\n').enumerate() {
        let start = offset;
        offset += raw.len() as u64 + 1;
        if raw.is_empty() {
            continue;
        }
        let entry =
            serde_json::from_slice::<Entry>(raw).map_err(|e| malformed(i + 1, e.to_string()))?;
        entries.push((start, entry));
    }
    Ok((entries, complete as u64, text.len() as u64))
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
            verdict: Verdict::Stable,
            signature: None,
            step: None,
            fidelity: None,
            pattern: None,
            lr: 1e-3,
            millis: 5,
            message: None,
        }
    }

    #[test]
    fn views_count_each_run_once_and_name_the_smallest_reproducer() {
        let sig = crate::finding::Signature {
            kind: crate::FindingKind::Nan,
            phase: crate::Phase::Loss,
            stage: "loss.mse".into(),
            family: "cnn".into(),
            optimizer: "adam".into(),
            precision: crate::spec::PrecisionKind::F32,
            device: crate::spec::DeviceSpec::Cpu,
        };
        let repro = |file: &str| Entry::Reproducer {
            signature: sig.clone(),
            file: file.into(),
            runs_used: 1,
            before: CaseSize::of(&Case::example("cnn").unwrap()),
            after: CaseSize::of(&Case::example("cnn").unwrap()),
        };
        // Merged shards: run 1 twice, two reproducers of one signature.
        let entries = vec![run(0), run(1), repro("b.json"), run(1), repro("a.json")];
        let indices: Vec<u64> = runs_once(&entries)
            .map(|e| match e {
                Entry::Run { index, .. } => *index,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(indices, [0, 1]);
        assert_eq!(reproducers(&entries)[&sig.slug()], "a.json");
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
        drop(j);
        let (_, e) = Journal::open(&dir).unwrap();
        assert_eq!(e, vec![run(0), run(1), run(2)]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
