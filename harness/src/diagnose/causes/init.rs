//! Weights initialized too large (step 3): a gain above 2 is tried at 1.
//! A smaller init removes the trigger, not the code's fault: only a suspect.

use super::{at_site, cause, tried, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::context::variant;
use crate::diagnose::Cause;
use crate::error::Result;
use crate::finding::Phase;

pub(in crate::diagnose) struct InitScale;

impl Rule for InitScale {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        if ctx.case.model.init().gain <= 2.0 {
            return Ok(Vec::new());
        }
        let v = variant("init gain 1.0", ctx.case, |c| c.model.init_mut().gain = 1.0);
        let fixes = tried(CauseKind::InitScale, vec![v], ctx, runs)?;
        let relevance = match ctx.finding.phase {
            Phase::Forward | Phase::Backward => Relevance::Suspect(30),
            _ => Relevance::Suspect(10),
        };
        Ok(cause(
            CauseKind::InitScale,
            fixes,
            at_site(ctx, relevance),
            relevance,
        ))
    }
}
