//! `merge`: combine the output directories of campaign shards into one:
//! journal entries concatenated (runs deduplicated by index), one
//! reproducer kept per signature (the smallest), and a fresh summary.

use crate::campaign::{summarize, CampaignOptions, Shard, Summary, REPRO_DIR, SUMMARY_FILE};
use crate::error::{Error, Result};
use crate::files::write_atomic;
use crate::journal::{read_entries, Entry, Journal, JOURNAL_FILE};
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
    let mut header: Option<(u64, Vec<String>, bool, f64)> = None;
    let mut start: Option<Entry> = None;
    let mut merged: Vec<Entry> = Vec::new();
    let mut runs = BTreeSet::new();
    let mut findings = BTreeSet::new();
    // Per signature, the smallest reproducer: ((params, steps, file), source, entry).
    let mut best: BTreeMap<String, Kept> = BTreeMap::new();
    for dir in inputs {
        let entries = read_entries(&dir.join(JOURNAL_FILE), false)?;
        for e in entries {
            match &e {
                Entry::Start {
                    seed,
                    families,
                    clean_data,
                    mutation_rate,
                    ..
                } => {
                    let this = (*seed, families.clone(), *clean_data, *mutation_rate);
                    match &header {
                        None => {
                            header = Some(this);
                            start = Some(e.clone());
                        }
                        Some(h) if *h == this => {}
                        Some(_) => {
                            return Err(Error::option(
                                "inputs",
                                format!("{} comes from a campaign with another seed, family list, data mode or mutation rate", dir.display()),
                            ))
                        }
                    }
                    continue;
                }
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
    let Some((seed, families, clean_data, mutation_rate)) = header else {
        return Err(Error::option(
            "inputs",
            "no campaign journal among the inputs",
        ));
    };
    // Copy the kept reproducers and journal them.
    for ((_, _, file), dir, entry) in best.into_values() {
        let from = dir.join(REPRO_DIR).join(&file);
        let text = crate::files::read_text(&from)?;
        write_atomic(&out.join(REPRO_DIR).join(&file), text.as_bytes())?;
        merged.push(entry);
    }
    let opts = CampaignOptions {
        strategy: StrategyOptions {
            families: families.clone(),
            clean_data,
            ..StrategyOptions::default()
        },
        seed,
        shard: Shard::default(),
        out: out.to_path_buf(),
        ..CampaignOptions::default()
    };
    let (mut journal, _) = Journal::open(out)?;
    let (device, budget, data) = match start {
        Some(Entry::Start {
            device,
            budget,
            data,
            ..
        }) => (device, budget, data),
        _ => unreachable!("a header was found"),
    };
    journal.append(&Entry::Start {
        nanhunt_version: env!("CARGO_PKG_VERSION").to_string(),
        seed,
        families,
        clean_data,
        shard: (0, 1),
        device,
        budget: format!("{budget} per shard, {} shards", inputs.len()),
        data,
        mutation_rate,
    })?;
    journal.append_group(&merged)?;
    let summary = summarize(&opts, &merged, Vec::new(), 0, Duration::ZERO);
    write_atomic(
        &out.join(SUMMARY_FILE),
        serde_json::to_string_pretty(&summary)
            .expect("summary serializes")
            .as_bytes(),
    )?;
    crate::campaign::write_reports(out, &read_entries(&out.join(JOURNAL_FILE), false)?)?;
    Ok(summary)
}
