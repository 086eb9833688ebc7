//! Half precision overflows or underflows (step 5): the case in f32, and
//! an f16 case in mixed precision with dynamic loss scaling.

use super::{cause, tried, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::context::variant;
use crate::diagnose::Cause;
use crate::error::Result;
use crate::finding::{Finding, FindingKind};
use crate::spec::{HalfType, LossScaling, Precision as Spec};

pub(in crate::diagnose) struct Precision;

impl Rule for Precision {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        if matches!(ctx.case.precision, Spec::F32 | Spec::F64) {
            return Ok(Vec::new());
        }
        let mut variants = vec![variant("precision f32", ctx.case, |c| {
            c.precision = Spec::F32
        })];
        if let Spec::F16 = ctx.case.precision {
            variants.push(variant(
                "mixed precision (f32 master weights, dynamic loss scaling)",
                ctx.case,
                |c| {
                    c.precision = Spec::Mixed {
                        compute: HalfType::F16,
                        loss_scaling: LossScaling::default(),
                    }
                },
            ));
        }
        let fixes = tried(CauseKind::Precision, variants, ctx, runs)?;
        let f = ctx.finding;
        let mut evidence = vec![format!("precision {}", ctx.case.precision.name())];
        if overflowed(f) {
            evidence.push(ctx.at());
        }
        let relevance = relevance(f);
        Ok(cause(CauseKind::Precision, fixes, evidence, relevance))
    }
}

/// An overflow of the format (or a collapsing loss scale).
pub(in crate::diagnose) fn overflowed(f: &Finding) -> bool {
    matches!(f.kind, FindingKind::Overflow | FindingKind::ScaleCollapse)
}

/// An overflow is the precision's to explain; any failure in half
/// precision makes it a suspect.
pub(in crate::diagnose) fn relevance(f: &Finding) -> Relevance {
    match (overflowed(f), f.signature.precision.is_half()) {
        (true, _) => Relevance::AtSite(9),
        (false, true) => Relevance::Suspect(30),
        (false, false) => Relevance::Unrelated,
    }
}
