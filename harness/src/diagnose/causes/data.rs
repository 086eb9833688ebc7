//! Bad values in the data (step 2): the dataset's flagged samples left
//! out, the injected pathologies removed, inputs of a large scale
//! standardized.

use super::{cause, tried, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::context::{variant, Variant};
use crate::diagnose::{BatchScan, Cause};
use crate::error::Result;
use crate::finding::Phase;

/// A `data.scale` or `data.offset` of this magnitude or more gets the
/// standardized-inputs candidate.
pub const INPUT_SCALE: f64 = 100.0;

pub(in crate::diagnose) struct Data;

impl Rule for Data {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        let fixes = tried(CauseKind::Data, candidates(ctx), ctx, runs)?;
        Ok(cause(
            CauseKind::Data,
            fixes,
            evidence(ctx),
            relevance(ctx.finding),
        ))
    }

    fn explains(&self, _phase: Phase) -> bool {
        true
    }
}

/// A failure in the data phase is the data's to explain.
pub(in crate::diagnose) fn relevance(f: &crate::finding::Finding) -> Relevance {
    match f.phase {
        Phase::Data => Relevance::AtSite(10),
        _ => Relevance::Unrelated,
    }
}

/// The changed data worth trying.
fn candidates(ctx: &Context) -> Vec<Variant> {
    let case = ctx.case;
    let mut variants = Vec::new();
    let bad = ctx.bad_samples;
    if !bad.is_empty() {
        let description = format!(
            "the data without the {} samples the data check flags ({})",
            bad.len(),
            crate::data::samples_phrase(bad)
        );
        variants.push(variant(description, case, |c| {
            if let Some(s) = c.data.source.sampling_mut() {
                s.exclude.extend_from_slice(bad);
                s.exclude.sort_unstable();
                s.exclude.dedup();
            }
        }));
    }
    if !case.data.pathologies.is_empty() {
        variants.push(variant("clean data: no injected pathologies", case, |c| {
            c.data.pathologies.clear()
        }));
    }
    if large_inputs(ctx) {
        variants.push(variant("inputs standardized to unit scale", case, |c| {
            c.data.scale = 1.0;
            c.data.offset = 0.0;
        }));
    }
    variants
}

fn large_inputs(ctx: &Context) -> bool {
    let d = &ctx.case.data;
    d.scale.abs() >= INPUT_SCALE || d.offset.abs() >= INPUT_SCALE
}

/// What the batch, the case's data and the dataset's scan say.
fn evidence(ctx: &Context) -> Vec<String> {
    let case = ctx.case;
    let mut e: Vec<String> = ctx
        .raw
        .findings()
        .into_iter()
        .map(|s| format!("batch before augmentation: {s}"))
        .collect();
    if large_inputs(ctx) {
        e.push(format!(
            "the inputs are scaled by {:e} with offset {:e}: activations and logits grow with them",
            case.data.scale, case.data.offset
        ));
    }
    if !case.data.pathologies.is_empty() {
        let names: Vec<&str> = case.data.pathologies.iter().map(|p| p.name()).collect();
        e.push(format!(
            "the data carries injected pathologies: {}",
            names.join(", ")
        ));
    }
    if ctx.finding.phase == Phase::Data {
        e.push(ctx.at());
    }
    e.extend(dataset_evidence(ctx.dataset, ctx.raw));
    e
}

/// What the whole-dataset scan and the failing batch's samples say.
fn dataset_evidence(scan: Option<&crate::data::scan::DataScan>, batch: &BatchScan) -> Vec<String> {
    let mut e = Vec::new();
    if let Some(scan) = scan {
        for p in scan.problems.iter().filter(|p| p.kind.is_error()) {
            e.push(format!(
                "{} of the {} samples of {} have {}: {}",
                p.count,
                scan.samples,
                scan.dataset,
                p.detail,
                crate::data::samples_phrase(&p.indices)
            ));
        }
    }
    if !batch.bad_samples.is_empty() {
        e.push(format!(
            "the failing batch holds {}",
            crate::data::samples_phrase(&batch.bad_samples)
        ));
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Case;

    #[test]
    fn the_input_scale_candidate_starts_at_100() {
        let mut case = Case::example("cnn").unwrap();
        let mut broken = case.clone();
        broken.optimizer.set_lr(1e6);
        let finding = crate::run(&broken).unwrap().finding().unwrap().clone();
        let scan = BatchScan::default();
        let has = |case: &Case| {
            let ctx = Context {
                case,
                finding: &finding,
                raw: &scan,
                augmented: &scan,
                dataset: None,
                bad_samples: &[],
                growth: None,
            };
            candidates(&ctx)
                .iter()
                .any(|v| v.description == "inputs standardized to unit scale")
        };
        case.data.scale = INPUT_SCALE;
        assert!(has(&case));
        case.data.scale = 99.0;
        assert!(!has(&case));
    }
}
