//! Optimizer eps too small for the precision (step 3): Adam's
//! m / (sqrt(v) + eps) is 0/0 where a gradient is exactly 0 and eps is 0.

use super::{at_site, cause, tried, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::context::variant;
use crate::diagnose::Cause;
use crate::error::Result;
use crate::finding::{Finding, FindingKind, OpKind, Phase};
use crate::spec::Precision;

pub(in crate::diagnose) struct OptimizerEps;

impl Rule for OptimizerEps {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        let half_master = matches!(ctx.case.precision, Precision::F16 | Precision::Bf16);
        let safe = safe_eps(half_master);
        let Some(eps) = ctx.case.optimizer.eps().filter(|&e| e < safe) else {
            return Ok(Vec::new());
        };
        let v = variant(
            format!("optimizer eps {eps:e} -> {safe:e}"),
            ctx.case,
            |c| {
                if let Some(eps) = c.optimizer.eps_mut() {
                    *eps = safe;
                }
            },
        );
        let fixes = tried(CauseKind::OptimizerEps, vec![v], ctx, runs)?;
        let relevance = relevance(ctx.finding);
        Ok(cause(
            CauseKind::OptimizerEps,
            fixes,
            at_site(ctx, relevance),
            relevance,
        ))
    }
}

/// The smallest eps that is safe for a master precision.
pub(in crate::diagnose) fn safe_eps(half_master: bool) -> f64 {
    if half_master {
        1e-4
    } else {
        1e-8
    }
}

/// A non-finite parameter or optimizer state after the update (not
/// clipping's, not a trend) is the eps's to explain.
pub(in crate::diagnose) fn relevance(f: &Finding) -> Relevance {
    let at_update = f.phase == Phase::Update
        && matches!(
            f.kind,
            FindingKind::Nan | FindingKind::Inf | FindingKind::Overflow
        )
        && f.op.is_none_or(|o| o.kind != OpKind::Clip);
    if at_update {
        Relevance::AtSite(10)
    } else {
        Relevance::Unrelated
    }
}
