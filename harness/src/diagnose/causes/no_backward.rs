//! An op without a backward pass cuts the gradient (step 3): the only
//! explanation of tensors without a gradient. Declaring them frozen trains
//! what the gradient reaches (a workaround; replacing the op trains them all).

use super::{cause, tried, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::context::variant;
use crate::diagnose::Cause;
use crate::error::Result;
use crate::finding::FindingKind;
use crate::spec::ModelSpec;

pub(in crate::diagnose) struct NoBackward;

impl Rule for NoBackward {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        let (Some(cov), ModelSpec::Custom(_)) = (&ctx.finding.coverage, &ctx.case.model) else {
            return Ok(Vec::new());
        };
        let frozen = cov.frozen_names();
        let v = variant(
            format!(
                "train only what the gradient reaches: declare the {} tensors without one frozen (a workaround; replacing the op trains them all)",
                frozen.len()
            ),
            ctx.case,
            |c| {
                if let Some(f) = c.model.frozen_mut() {
                    f.extend(frozen);
                }
            },
        );
        let fixes = tried(CauseKind::NoBackward, vec![v], ctx, runs)?;
        let relevance = relevance(ctx.finding);
        Ok(cause(
            CauseKind::NoBackward,
            fixes,
            vec![cov.summary()],
            relevance,
        ))
    }
}

/// Only the cut explains tensors without a gradient.
pub(in crate::diagnose) fn relevance(f: &crate::finding::Finding) -> Relevance {
    match f.kind {
        FindingKind::NoGradient => Relevance::AtSite(40),
        _ => Relevance::Unrelated,
    }
}
