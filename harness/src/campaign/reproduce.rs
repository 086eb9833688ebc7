//! Turning a finding into a reproducer: minimize its case while the
//! signature holds, write `repro/<signature>-<hash>.json`, and say in a
//! journal entry what came of it. Worker processes and threads run this
//! same code.

use crate::error::{Error, Result};
use crate::finding::Signature;
use crate::journal::{Entry, Unminimized};
use crate::minimize::{minimize, MinimizeOptions};
use crate::runner::RunOptions;
use crate::spec::{Case, Limits};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The reproducers' directory under a campaign's.
pub const REPRO_DIR: &str = "repro";

/// What minimizing a finding needs besides the case.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReproduceJob {
    /// The run that found it.
    pub index: u64,
    /// The failing case.
    pub case: Case,
    /// Its signature.
    pub signature: Signature,
    /// The campaign's directory.
    pub out: PathBuf,
    /// Training runs the minimizer may spend.
    pub minimize_runs: usize,
    /// The campaign seed (the reproducer's name and provenance).
    pub campaign_seed: u64,
    /// The campaign's case limits, which every candidate is held to.
    #[serde(default)]
    pub limits: Limits,
    /// Stop shrinking after this long (what is left of the campaign's budget).
    #[serde(default)]
    pub time_limit: Option<Duration>,
}

/// The reproducer file name: `<signature-slug>-<short hash of the case>.json`.
pub fn reproducer_name(signature: &Signature, case: &Case) -> String {
    format!(
        "{}-{}.json",
        signature.slug(),
        &format!("{:016x}", crate::rng::fnv1a(case.to_json().as_bytes()))[..8]
    )
}

/// Minimizes a finding and writes its reproducer; returns the journal
/// entry: the reproducer, or `unminimized` when the finding does not come
/// back from a fresh start.
pub fn reproduce(job: &ReproduceJob) -> Result<Entry> {
    let m = minimize(
        &job.case,
        None,
        &MinimizeOptions {
            max_runs: job.minimize_runs,
            run: RunOptions {
                limits: job.limits.clone(),
                ..RunOptions::default()
            },
            deadline: job.time_limit.map(|t| Instant::now() + t),
        },
    );
    let not_reproducible = |message: String| Entry::Unminimized {
        signature: job.signature.clone(),
        reason: Unminimized::NotReproducible,
        message,
    };
    let m = match m {
        Err(Error::Rejected(reason)) => return Ok(not_reproducible(reason)),
        m => m?,
    };
    let Some(m) = m.filter(|m| m.signature == job.signature) else {
        return Ok(not_reproducible(
            "the finding did not come back when its case ran from the start".into(),
        ));
    };
    let provenance = format!("campaign seed {} run {}", job.campaign_seed, job.index);
    let repro = m.reproducer(&job.case, provenance);
    let file = reproducer_name(&m.signature, &m.case);
    // Inside the campaign's directory only: one deleted under the campaign
    // is not made again here (its journal check stops the campaign).
    let dir = job.out.join(REPRO_DIR);
    match std::fs::create_dir(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(Error::io(&dir, e));
        }
        _ => {}
    }
    repro.write(&dir.join(&file))?;
    Ok(Entry::Reproducer {
        signature: m.signature,
        file,
        runs_used: m.runs,
        before: m.before,
        after: m.after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproducer_names_are_safe_and_stable() {
        let c = Case::example("cnn").unwrap();
        let sig = Signature {
            kind: crate::FindingKind::Nan,
            phase: crate::Phase::Augment,
            stage: "augment.normalize".into(),
            family: "cnn".into(),
            optimizer: "adam".into(),
            precision: crate::spec::PrecisionKind::F32,
            device: crate::spec::DeviceSpec::Cuda(0),
        };
        let name = reproducer_name(&sig, &c);
        assert_eq!(name, reproducer_name(&sig, &c));
        assert!(
            name.starts_with("nan-augment-augment.normalize-cnn-adam-f32-cuda_0-"),
            "{name}"
        );
        assert!(
            name.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch)),
            "{name}"
        );
    }
}
