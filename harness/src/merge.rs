//! `merge`: combine the output directories of campaign shards into one:
//! journal entries concatenated (runs deduplicated by index), one
//! reproducer kept per signature (the smallest), and a fresh summary.
//!
//! Each shard is checked as a campaign checks its own journal when it
//! resumes — a start line, the same campaign as the other shards (seed,
//! families, data, data mode, mutation rate, shard count), its own shard
//! index, runs inside that shard, findings whose cases validate — and
//! every reproducer it journals must parse and be the reproducer of its
//! signature. The merge takes the output directory's lock and writes its
//! journal last (atomically), so a merge killed at any write is redone by
//! running it again, which then delivers its exit code.

use crate::campaign::{summarize, CampaignOptions, Shard, Summary, REPRO_DIR, SUMMARY_FILE};
use crate::error::{Error, Result};
use crate::files::write_atomic;
use crate::journal::{lines, read_entries, CampaignId, Entry, JOURNAL_FILE};
use crate::strategy::StrategyOptions;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A reproducer's rank (smaller is better: parameters, steps, file name),
/// its shard directory and its journal entry.
type Kept = ((usize, usize, String), PathBuf, Entry);

/// Merges shard directories into `out` (which must not hold a journal yet).
pub fn merge(inputs: &[PathBuf], out: &Path) -> Result<Summary> {
    if out.join(JOURNAL_FILE).exists() {
        return Err(Error::io(
            out,
            std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "already holds a campaign journal",
            ),
        ));
    }
    let shards = inputs
        .iter()
        .map(|dir| checked_shard(dir))
        .collect::<Result<Vec<_>>>()?;
    let Some((first, start)) = shards.first() else {
        return Err(Error::option(
            "inputs",
            "no campaign journal among the inputs",
        ));
    };
    let mut indices = BTreeSet::new();
    for ((campaign, _), dir) in shards.iter().zip(inputs) {
        let differences = first.differences(campaign, false);
        if !differences.is_empty() {
            return Err(Error::option(
                "inputs",
                format!(
                    "{} comes from another campaign than {}: {}",
                    dir.display(),
                    inputs[0].display(),
                    differences.join(", ")
                ),
            ));
        }
        let (index, count) = campaign.shard;
        if !indices.insert(index) {
            return Err(Error::option(
                "inputs",
                format!(
                    "{} is shard {index} of {count} again: each shard is merged once",
                    dir.display()
                ),
            ));
        }
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    // One writer at a time; what a killed merge left is this one's to redo.
    let _lock = crate::journal::take_dir(out, &[&out.join(REPRO_DIR)])?;
    let mut merged: Vec<Entry> = Vec::new();
    let mut runs = BTreeSet::new();
    let mut findings = BTreeSet::new();
    // Per signature, the smallest reproducer: ((params, steps, file), source, entry).
    let mut best: BTreeMap<String, Kept> = BTreeMap::new();
    for dir in inputs {
        for e in read_entries(&dir.join(JOURNAL_FILE), false)? {
            match &e {
                Entry::Start { .. } => continue,
                Entry::Run { index, .. } if !runs.insert(*index) => continue,
                Entry::Finding { signature, .. } if !findings.insert(signature.slug()) => continue,
                Entry::Reproducer {
                    signature,
                    file,
                    after,
                    ..
                } => {
                    let key = (after.params, after.steps, file.clone());
                    if best.get(&signature.slug()).is_none_or(|(k, _, _)| key < *k) {
                        best.insert(signature.slug(), (key, dir.clone(), e.clone()));
                    }
                    continue; // journaled below, one per signature
                }
                _ => {}
            }
            merged.push(e);
        }
    }
    let mut writes = Writes::default();
    // Copy the kept reproducers and journal them.
    for ((_, _, file), dir, entry) in best.into_values() {
        let from = dir.join(REPRO_DIR).join(&file);
        let text = crate::files::read_text(&from)?;
        writes.next();
        write_atomic(&out.join(REPRO_DIR).join(&file), text.as_bytes())?;
        merged.push(entry);
    }
    let Entry::Start {
        device,
        budget,
        data,
        ..
    } = start.clone()
    else {
        unreachable!("checked_shard returns a start line")
    };
    let opts = CampaignOptions {
        strategy: StrategyOptions {
            families: first.families.clone(),
            clean_data: first.clean_data,
            scale: first.size,
            ..StrategyOptions::default()
        },
        seed: first.seed,
        shard: Shard::default(),
        out: out.to_path_buf(),
        ..CampaignOptions::default()
    };
    let mut journal = vec![Entry::Start {
        nanhunt_version: env!("CARGO_PKG_VERSION").to_string(),
        seed: first.seed,
        families: first.families.clone(),
        clean_data: first.clean_data,
        shard: (0, 1),
        device,
        budget: format!("{budget} per shard, {} shards", inputs.len()),
        data,
        mutation_rate: first.mutation_rate,
        size: first.size,
    }];
    journal.extend(merged);
    let summary = summarize(&opts, &journal[1..], Vec::new(), 0, Duration::ZERO);
    writes.next();
    write_atomic(
        &out.join(SUMMARY_FILE),
        serde_json::to_string_pretty(&summary)
            .expect("summary serializes")
            .as_bytes(),
    )?;
    writes.next();
    crate::campaign::write_reports(out, &journal)?;
    // The journal last: until it is in place, the merge can be run again.
    writes.next();
    write_atomic(&out.join(JOURNAL_FILE), lines(&journal).as_bytes())?;
    Ok(summary)
}

/// Fault injection for the kill test: the merge aborts before its N-th
/// write (0 the first: the reproducers, the summary, the reports, the
/// journal).
pub const ABORT_BEFORE_WRITE_ENV: &str = "NANHUNT_ABORT_MERGE_BEFORE_WRITE";

/// Counts a merge's writes (see [`ABORT_BEFORE_WRITE_ENV`]).
#[derive(Default)]
struct Writes(usize);

impl Writes {
    fn next(&mut self) {
        let at = std::env::var(ABORT_BEFORE_WRITE_ENV).ok();
        if at.and_then(|a| a.parse().ok()) == Some(self.0) {
            std::process::abort();
        }
        self.0 += 1;
    }
}

/// A shard's campaign and its start line, checked as a campaign checks
/// its own journal when it resumes (see the module docs).
fn checked_shard(dir: &Path) -> Result<(CampaignId, Entry)> {
    let path = dir.join(JOURNAL_FILE);
    let refuse = |why: String| Error::option("inputs", format!("{}: {why}", dir.display()));
    if !path.is_file() {
        return Err(refuse("no campaign journal (journal.jsonl) in it".into()));
    }
    let entries = read_entries(&path, false)?;
    let Some(start @ Entry::Start { .. }) = entries.first() else {
        return Err(refuse(
            "its journal has no start line: it is empty, or not a campaign's".into(),
        ));
    };
    let campaign = CampaignId::of(start).expect("a start line");
    let (index, count) = campaign.shard;
    crate::campaign::check_resumable(&entries, &path)?;
    if let Some(run) = entries.iter().find_map(|e| match e {
        Entry::Run { index: i, .. } if *i % count.max(1) != index => Some(*i),
        _ => None,
    }) {
        return Err(refuse(format!(
            "run {run} is not in its shard ({index} of {count})"
        )));
    }
    for e in &entries {
        let Entry::Reproducer {
            signature, file, ..
        } = e
        else {
            continue;
        };
        let repro = crate::repro::Reproducer::load(&dir.join(REPRO_DIR).join(file))
            .map_err(|e| refuse(format!("reproducer {file}: {e}")))?;
        if repro.expected.signature != *signature {
            return Err(refuse(format!(
                "reproducer {file} is the reproducer of {}, not of {signature} as the journal says",
                repro.expected.signature
            )));
        }
    }
    Ok((campaign, start.clone()))
}
