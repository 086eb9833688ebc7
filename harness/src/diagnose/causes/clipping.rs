//! Exploding gradients without clipping (step 3): the textbook answer to
//! an exploding gradient is to clip its norm.

use super::learning_rate::trend_evidence;
use super::{cause, tried, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::context::variant;
use crate::diagnose::Cause;
use crate::error::Result;
use crate::finding::{FindingKind, Phase};
use crate::spec::ClipSpec;

pub(in crate::diagnose) struct NoClipping;

impl Rule for NoClipping {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        if matches!(ctx.case.clip, ClipSpec::Norm { max_norm } if max_norm <= 1.0) {
            return Ok(Vec::new());
        }
        let v = variant("clip the gradient norm to 1.0", ctx.case, |c| {
            c.clip = ClipSpec::Norm { max_norm: 1.0 }
        });
        let fixes = tried(CauseKind::NoClipping, vec![v], ctx, runs)?;
        let f = ctx.finding;
        let relevance = match (f.kind, f.phase) {
            (FindingKind::Explosion, _) => Relevance::AtSite(12),
            (FindingKind::Divergence, _) => Relevance::Suspect(45),
            (_, Phase::Backward | Phase::Update) => Relevance::Suspect(20),
            _ => Relevance::Suspect(5),
        };
        Ok(cause(
            CauseKind::NoClipping,
            fixes,
            trend_evidence(ctx),
            relevance,
        ))
    }
}
