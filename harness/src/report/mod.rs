//! The stability report: what a campaign's runs say, per family × loss ×
//! optimizer × precision × device, rendered as JSON, Markdown and a
//! self-contained HTML page with SVG plots. The report reads outcomes and
//! never runs anything. Every float in it is rounded (3 significant digits
//! for learning rates, 4 for losses) and every collection sorted, so that
//! the same campaign gives byte-identical output, ready for snapshots.

mod html;
mod markdown;

use crate::finding::{Signature, Verdict};
use crate::journal::Entry;
use crate::strategy::ModelScale;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the campaign was (from its journal's start line).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReportHeader {
    /// The version that ran it.
    pub nanhunt_version: String,
    /// The campaign seed.
    pub seed: u64,
    /// The families it drew from.
    pub families: Vec<String>,
    /// The device.
    pub device: String,
    /// The budget it was started with.
    pub budget: String,
    /// Whether the data pathologies were off.
    pub clean_data: bool,
    /// The data every case trained on, in words, when the campaign fixed
    /// it (a dataset file, a user's model's dataset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// The scale of the models drawn (`--size`; small is left unwritten).
    #[serde(default, skip_serializing_if = "ModelScale::is_small")]
    pub size: ModelScale,
}

impl ReportHeader {
    /// What the campaign drew, beside the default, as the headers print
    /// it after the budget (", clean data, large models"; empty for the
    /// default draws).
    pub(crate) fn drawn(&self) -> String {
        let clean = if self.clean_data { ", clean data" } else { "" };
        let large = if self.size.is_small() {
            ""
        } else {
            ", large models"
        };
        format!("{clean}{large}")
    }
}

/// Run counts by verdict.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Every run.
    pub runs: u64,
    /// Stable runs.
    pub stable: u64,
    /// Unstable runs.
    pub unstable: u64,
    /// Rejected, errored or panicked runs.
    pub errors: u64,
    /// Runs stopped at the case timeout.
    #[serde(default)]
    pub timeouts: u64,
}

/// One configuration: family × loss × optimizer × precision × device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// The model family.
    pub family: String,
    /// The loss.
    pub loss: String,
    /// The optimizer.
    pub optimizer: String,
    /// The precision.
    pub precision: String,
    /// The device.
    pub device: String,
    /// Its run counts.
    pub totals: Totals,
    /// Unstable runs by signature slug.
    pub failures: BTreeMap<String, u64>,
    /// The earliest failing step.
    pub first_failure_step: Option<usize>,
    /// Its reproducers' files.
    pub reproducers: Vec<String>,
    /// [lowest, highest] learning rate seen stable / unstable.
    pub lr_stable: Option<[f64; 2]>,
    /// [lowest, highest] learning rate seen unstable.
    pub lr_unstable: Option<[f64; 2]>,
}

/// One signature found by the campaign.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SignatureRow {
    /// The signature's slug.
    pub slug: String,
    /// The signature.
    pub signature: Signature,
    /// Runs that showed it.
    pub count: u64,
    /// The earliest step at which it appeared.
    pub first_step: usize,
    /// Its reproducer's file, if written.
    pub reproducer: Option<String>,
    /// The precision check of its runs (the first one checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fidelity: Option<crate::finding::Robustness>,
    /// What the producing stage did (the first run explained).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<crate::finding::Pattern>,
}

/// The loss curve of a representative run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    /// The run's family.
    pub family: String,
    /// How it ended.
    pub verdict: Verdict,
    /// The run's index.
    pub index: u64,
    /// Its signature's slug, if unstable.
    pub signature: Option<String>,
    /// The loss of each step.
    #[serde(with = "crate::floats::vec")]
    pub losses: Vec<f64>,
}

/// Runs and failures in one decade of learning rate, per family.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LrBin {
    /// The model family.
    pub family: String,
    /// floor(log10(lr)); lr 0 counts in the lowest decade seen.
    pub decade: i32,
    /// Runs in the decade.
    pub runs: u64,
    /// Unstable runs in it.
    pub unstable: u64,
}

/// A campaign's stability report: a view of its journal (JSON, Markdown, HTML).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StabilityReport {
    /// What the campaign was.
    pub header: ReportHeader,
    /// Run counts.
    pub totals: Totals,
    /// Each signature found.
    pub signatures: Vec<SignatureRow>,
    /// Per configuration.
    pub groups: Vec<Group>,
    /// Every reproducer written.
    pub reproducers: Vec<String>,
    /// Representative loss curves.
    pub curves: Vec<Curve>,
    /// Runs and failures per decade of learning rate.
    pub lr_sweep: Vec<LrBin>,
}

pub use crate::format::round_sig;

fn widen(range: &mut Option<[f64; 2]>, lr: f64) {
    let lr = round_sig(lr, 3);
    *range = Some(match *range {
        None => [lr, lr],
        Some([lo, hi]) => [lo.min(lr), hi.max(lr)],
    });
}

impl StabilityReport {
    /// Builds the report of a campaign journal's entries.
    pub fn from_entries(entries: &[Entry]) -> StabilityReport {
        let mut header = ReportHeader {
            nanhunt_version: env!("CARGO_PKG_VERSION").to_string(),
            seed: 0,
            families: Vec::new(),
            device: "cpu".into(),
            budget: String::new(),
            clean_data: false,
            data: None,
            size: ModelScale::Small,
        };
        let mut totals = Totals::default();
        let mut groups: BTreeMap<(String, String, String, String, String), Group> = BTreeMap::new();
        let mut sigs: BTreeMap<String, SignatureRow> = BTreeMap::new();
        let reproducer_of = crate::journal::reproducers(entries);
        // Stable sorts before unstable, by name as before and by declaration.
        let mut curves: BTreeMap<(String, Verdict), Curve> = BTreeMap::new();
        let mut bins: BTreeMap<(String, i32), LrBin> = BTreeMap::new();
        for e in entries {
            if let Entry::Start {
                nanhunt_version,
                seed,
                families,
                clean_data,
                device,
                budget,
                data,
                size,
                ..
            } = e
            {
                header = ReportHeader {
                    nanhunt_version: nanhunt_version.clone(),
                    seed: *seed,
                    families: families.clone(),
                    device: device.clone(),
                    budget: budget.clone(),
                    clean_data: *clean_data,
                    data: data.clone(),
                    size: *size,
                };
            }
        }
        // Each run index once, as every view of the journal counts it.
        for e in crate::journal::runs_once(entries) {
            let Entry::Run {
                index,
                family,
                loss,
                optimizer,
                precision,
                device,
                verdict,
                signature,
                step,
                lr,
                losses,
                fidelity,
                pattern,
                ..
            } = e
            else {
                continue;
            };
            let key = (
                family.clone(),
                loss.clone(),
                optimizer.clone(),
                precision.clone(),
                device.clone(),
            );
            let g = groups.entry(key).or_insert_with(|| Group {
                family: family.clone(),
                loss: loss.clone(),
                optimizer: optimizer.clone(),
                precision: precision.clone(),
                device: device.clone(),
                totals: Totals::default(),
                failures: BTreeMap::new(),
                first_failure_step: None,
                reproducers: Vec::new(),
                lr_stable: None,
                lr_unstable: None,
            });
            for t in [&mut totals, &mut g.totals] {
                t.runs += 1;
                match verdict {
                    Verdict::Stable => t.stable += 1,
                    Verdict::Unstable => t.unstable += 1,
                    Verdict::Timeout => t.timeouts += 1,
                    // Rejected runs too: the summary counts them apart.
                    _ => t.errors += 1,
                }
            }
            match verdict {
                Verdict::Stable => widen(&mut g.lr_stable, *lr),
                Verdict::Unstable => widen(&mut g.lr_unstable, *lr),
                _ => {}
            }
            if let (Some(sig), Some(step)) = (signature, step) {
                *g.failures.entry(sig.slug()).or_insert(0) += 1;
                g.first_failure_step = Some(g.first_failure_step.map_or(*step, |s| s.min(*step)));
                let row = sigs.entry(sig.slug()).or_insert_with(|| SignatureRow {
                    slug: sig.slug(),
                    signature: sig.clone(),
                    count: 0,
                    first_step: *step,
                    reproducer: None,
                    fidelity: None,
                    pattern: None,
                });
                row.fidelity = row.fidelity.or(*fidelity);
                row.pattern = row.pattern.or(*pattern);
                row.count += 1;
                row.first_step = row.first_step.min(*step);
            }
            if matches!(verdict, Verdict::Stable | Verdict::Unstable) {
                // The representative run of a family and verdict: the lowest index.
                let slot = curves
                    .entry((family.clone(), *verdict))
                    .or_insert_with(|| Curve {
                        family: family.clone(),
                        verdict: *verdict,
                        index: u64::MAX,
                        signature: None,
                        losses: Vec::new(),
                    });
                if *index < slot.index {
                    slot.index = *index;
                    slot.signature = signature.as_ref().map(|s| s.slug());
                    slot.losses = losses.iter().map(|&l| round_sig(l, 4)).collect();
                }
                let decade = if *lr > 0.0 {
                    lr.log10().floor() as i32
                } else {
                    -12
                };
                let bin = bins
                    .entry((family.clone(), decade))
                    .or_insert_with(|| LrBin {
                        family: family.clone(),
                        decade,
                        runs: 0,
                        unstable: 0,
                    });
                bin.runs += 1;
                bin.unstable += u64::from(*verdict == Verdict::Unstable);
            }
        }
        for row in sigs.values_mut() {
            row.reproducer = reproducer_of.get(&row.slug).cloned();
        }
        let mut groups: Vec<Group> = groups.into_values().collect();
        for g in &mut groups {
            g.reproducers = g
                .failures
                .keys()
                .filter_map(|s| reproducer_of.get(s).cloned())
                .collect();
        }
        StabilityReport {
            header,
            totals,
            signatures: sigs.into_values().collect(),
            groups,
            reproducers: reproducer_of.into_values().collect(),
            curves: curves.into_values().collect(),
            lr_sweep: bins.into_values().collect(),
        }
    }

    /// Reads a campaign directory's journal.
    pub fn from_dir(dir: &std::path::Path) -> crate::Result<StabilityReport> {
        let entries = crate::journal::read_entries(&dir.join(crate::journal::JOURNAL_FILE), false)?;
        Ok(StabilityReport::from_entries(&entries))
    }

    /// The report as JSON (byte-identical for the same journal).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("reports serialize")
    }

    /// The report as Markdown.
    pub fn to_markdown(&self) -> String {
        markdown::render(self)
    }

    /// The report as a self-contained HTML page with plots.
    pub fn to_html(&self) -> String {
        html::render(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_shows_what_its_stage_did() {
        let case = crate::spec::Case::example("cnn").unwrap();
        let signature = Signature {
            kind: crate::finding::FindingKind::Nan,
            phase: crate::finding::Phase::Forward,
            stage: "rownorm".into(),
            family: "user_mlp".into(),
            optimizer: "adam".into(),
            precision: crate::spec::PrecisionKind::F32,
            device: crate::spec::DeviceSpec::Cpu,
        };
        let record = crate::record::RunResult {
            verdict: Verdict::Unstable,
            signature: Some(signature),
            step: Some(3),
            losses: vec![1.0],
            message: None,
            fidelity: None,
            pattern: Some(crate::finding::Pattern::ZeroNormRow),
        };
        let report = StabilityReport::from_entries(&[Entry::run(0, &case, record, 1)]);
        assert_eq!(
            report.signatures[0].pattern,
            Some(crate::finding::Pattern::ZeroNormRow)
        );
        let md = markdown::render(&report);
        assert!(md.contains("| norm of an all-zero row |"), "{md}");
    }

    #[test]
    fn rounding_keeps_significant_digits() {
        assert_eq!(round_sig(0.012345, 3), 0.0123);
        assert_eq!(round_sig(123456.0, 3), 123000.0);
        assert!(round_sig(f64::NAN, 3).is_nan());
    }
}
