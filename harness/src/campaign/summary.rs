//! `summary.json`: what a campaign's journal holds, signature by signature,
//! and which signatures no session has reported yet.

use super::options::CampaignOptions;
use crate::finding::{Signature, Verdict};
use crate::journal::Entry;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The summary's file name in a campaign directory.
pub const SUMMARY_FILE: &str = "summary.json";

/// One distinct signature of a campaign.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SignatureSummary {
    /// The signature's slug.
    pub slug: String,
    /// The signature.
    pub signature: Signature,
    /// Runs that showed it.
    pub count: u64,
    /// The first run that did.
    pub first_index: u64,
    /// The reproducer file under `repro/`, once minimized.
    pub reproducer: Option<String>,
    /// Why there is no reproducer, when its minimization gave up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unminimized: Option<String>,
}

/// `summary.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The campaign seed.
    pub seed: u64,
    /// The families it draws from.
    pub families: Vec<String>,
    /// This shard's (index, count).
    pub shard: (u64, u64),
    /// Runs journaled, all sessions.
    pub runs: u64,
    /// Runs made by this session.
    pub runs_this_session: u64,
    /// Stable runs.
    pub stable: u64,
    /// Unstable runs.
    pub unstable: u64,
    /// Rejected cases.
    pub rejected: u64,
    /// Runs that ended in an error, a panic or a crash.
    pub errors: u64,
    /// Runs stopped at `--case-timeout`: neither stable nor a finding.
    #[serde(default)]
    pub timeouts: u64,
    /// Each signature found.
    pub signatures: Vec<SignatureSummary>,
    /// Signatures that no earlier session reported: found in this session,
    /// or in one that was killed before it ended (the exit code is 1 when any).
    pub new_signatures: Vec<String>,
    /// This session's wall time.
    pub elapsed_s: f64,
    /// This session's throughput.
    pub runs_per_s: f64,
    /// Runs per device, where they ran on more than one (a `--device
    /// cuda` campaign places small cases on the CPU); empty otherwise.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub runs_by_device: BTreeMap<String, u64>,
}

/// The signatures found in a journal that no session has reported yet.
pub fn unreported(entries: &[Entry]) -> Vec<String> {
    let reported: BTreeSet<&String> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Reported { signatures } => Some(signatures),
            _ => None,
        })
        .flatten()
        .collect();
    let mut new = Vec::new();
    for e in entries {
        if let Entry::Finding { signature, .. } = e {
            let slug = signature.slug();
            if !reported.contains(&slug) && !new.contains(&slug) {
                new.push(slug);
            }
        }
    }
    new
}

/// The summary of a campaign's journal entries.
pub fn summarize(
    opts: &CampaignOptions,
    entries: &[Entry],
    new: Vec<String>,
    session_runs: u64,
    elapsed: Duration,
) -> Summary {
    let mut sigs: BTreeMap<String, SignatureSummary> = BTreeMap::new();
    let (mut runs, mut stable, mut unstable, mut rejected, mut errors) = (0, 0, 0, 0, 0);
    let mut timeouts = 0;
    let mut runs_by_device: BTreeMap<String, u64> = BTreeMap::new();
    for e in crate::journal::runs_once(entries) {
        let Entry::Run {
            index,
            verdict,
            signature,
            device,
            ..
        } = e
        else {
            continue;
        };
        runs += 1;
        *runs_by_device.entry(device.clone()).or_default() += 1;
        match verdict {
            Verdict::Stable => stable += 1,
            Verdict::Unstable => unstable += 1,
            Verdict::Rejected => rejected += 1,
            Verdict::Timeout => timeouts += 1,
            Verdict::Error | Verdict::Panic | Verdict::Crash => errors += 1,
        }
        if let Some(sig) = signature {
            let s = sigs.entry(sig.slug()).or_insert_with(|| SignatureSummary {
                slug: sig.slug(),
                signature: sig.clone(),
                count: 0,
                first_index: *index,
                reproducer: None,
                unminimized: None,
            });
            s.count += 1;
            s.first_index = s.first_index.min(*index);
        }
    }
    let reproducers = crate::journal::reproducers(entries);
    let unminimized: BTreeMap<String, &String> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Unminimized {
                signature, message, ..
            } => Some((signature.slug(), message)),
            _ => None,
        })
        .collect();
    for s in sigs.values_mut() {
        s.reproducer = reproducers.get(&s.slug).cloned();
        if s.reproducer.is_none() {
            s.unminimized = unminimized.get(&s.slug).map(|m| m.to_string());
        }
    }
    let secs = elapsed.as_secs_f64();
    Summary {
        seed: opts.seed,
        families: opts.strategy.families.clone(),
        shard: (opts.shard.index, opts.shard.count),
        runs,
        runs_this_session: session_runs,
        stable,
        unstable,
        rejected,
        errors,
        timeouts,
        signatures: sigs.into_values().collect(),
        new_signatures: new,
        elapsed_s: secs,
        runs_per_s: if secs > 0.0 {
            session_runs as f64 / secs
        } else {
            0.0
        },
        runs_by_device: if runs_by_device.len() > 1 {
            runs_by_device
        } else {
            BTreeMap::new()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RunResult;
    use crate::spec::{Case, DeviceSpec};

    fn run_on(index: u64, device: DeviceSpec) -> Entry {
        let mut case = Case::example("cnn").unwrap();
        case.device = device;
        let record = RunResult {
            verdict: Verdict::Stable,
            signature: None,
            step: None,
            losses: vec![1.0, 0.5],
            message: None,
            fidelity: None,
            pattern: None,
        };
        Entry::run(index, &case, record, 3)
    }

    #[test]
    fn runs_are_counted_per_device_only_where_there_were_two() {
        let opts = CampaignOptions::default();
        let one = [run_on(0, DeviceSpec::Cpu), run_on(1, DeviceSpec::Cpu)];
        let s = summarize(&opts, &one, Vec::new(), 2, Duration::from_secs(1));
        assert!(s.runs_by_device.is_empty());
        assert!(!serde_json::to_string(&s)
            .unwrap()
            .contains("runs_by_device"));
        let two = [
            run_on(0, DeviceSpec::Cpu),
            run_on(1, DeviceSpec::Cuda(0)),
            run_on(2, DeviceSpec::Cpu),
        ];
        let s = summarize(&opts, &two, Vec::new(), 3, Duration::from_secs(1));
        let want: BTreeMap<String, u64> = [("cpu".into(), 2), ("cuda:0".into(), 1)].into();
        assert_eq!(s.runs_by_device, want);
    }
}
