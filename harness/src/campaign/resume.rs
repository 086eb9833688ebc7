//! What a campaign's journal says is left to do when it resumes: the runs
//! done, the signatures found, and the findings whose minimization is not
//! settled (no reproducer, and no reason to give up on one).

use crate::error::{Document, Error, Result};
use crate::finding::Signature;
use crate::journal::{Entry, MINIMIZE_ATTEMPTS};
use crate::spec::{Case, Limits};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A finding to minimize (again).
pub(super) struct Pending {
    pub index: u64,
    pub signature: Signature,
    pub case: Case,
    /// Minimizations started before (their worker died).
    pub attempts: usize,
}

pub(super) struct Resumed {
    pub done: BTreeSet<u64>,
    /// The case of each known signature, by slug.
    pub found: BTreeMap<String, Case>,
    pub pending: Vec<Pending>,
}

impl Resumed {
    /// Folds a journal's entries; a finding whose case no longer validates
    /// is an error naming the journal.
    pub fn of(entries: &[Entry], journal_path: &Path) -> Result<Resumed> {
        let mut done = BTreeSet::new();
        let mut found = BTreeMap::new();
        let mut attempts: BTreeMap<String, usize> = BTreeMap::new();
        let mut settled = BTreeSet::new();
        let mut findings = Vec::new();
        for e in entries {
            match e {
                Entry::Run { index, .. } => {
                    done.insert(*index);
                }
                Entry::Finding {
                    index,
                    signature,
                    case,
                } => {
                    if let Err(e) = case.validate(&Limits::default()) {
                        return Err(Error::malformed(
                            Document::Journal,
                            journal_path,
                            format!(
                                "the finding of run {index} ({signature}) holds an invalid case: {e}"
                            ),
                        ));
                    }
                    found.insert(signature.slug(), (**case).clone());
                    findings.push((*index, signature.clone(), (**case).clone()));
                }
                Entry::Reproducer { signature, .. } => {
                    settled.insert(signature.slug());
                }
                Entry::Unminimized {
                    signature, reason, ..
                } => {
                    let n = attempts.entry(signature.slug()).or_insert(0);
                    *n += 1;
                    if !reason.retryable() || *n >= MINIMIZE_ATTEMPTS {
                        settled.insert(signature.slug());
                    }
                }
                Entry::Start { .. } | Entry::Reported { .. } => {}
            }
        }
        let pending = findings
            .into_iter()
            .filter(|(_, s, _)| !settled.contains(&s.slug()))
            .map(|(index, signature, case)| Pending {
                attempts: attempts.get(&signature.slug()).copied().unwrap_or(0),
                index,
                signature,
                case,
            })
            .collect();
        Ok(Resumed {
            done,
            found,
            pending,
        })
    }
}

/// The journal's entries as the reproducer directory holds them: a
/// reproducer whose file is gone is dropped (its finding is minimized
/// again), and a file there that no entry names (a killed session wrote
/// it and lost its entry; its finding is minimized again too) is removed.
/// Each says so on stderr. The caller holds the directory's lock.
pub(super) fn reconcile(repro: &Path, entries: Vec<Entry>) -> Vec<Entry> {
    let named: BTreeSet<String> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Reproducer { file, .. } => Some(file.clone()),
            _ => None,
        })
        .collect();
    if let Ok(read) = std::fs::read_dir(repro) {
        for f in read.flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') && !named.contains(&name) && f.path().is_file() {
                eprintln!(
                    "note: {} is no journaled reproducer (a killed session's): removed",
                    f.path().display()
                );
                let _ = std::fs::remove_file(f.path());
            }
        }
    }
    entries
        .into_iter()
        .filter(|e| match e {
            Entry::Reproducer {
                file, signature, ..
            } if !repro.join(file).is_file() => {
                eprintln!(
                    "note: the reproducer of {signature} ({}) is gone: it is minimized again",
                    repro.join(file).display()
                );
                false
            }
            _ => true,
        })
        .collect()
}
