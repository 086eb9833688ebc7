//! A numerically unsafe loss (step 4): the naive cross-entropy, BCE on
//! probabilities, log(1 - p) or a KL divergence or Poisson NLL without an
//! eps, each tried as its stable counterpart.

use super::{at_site, cause, tried, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::context::variant;
use crate::diagnose::Cause;
use crate::error::Result;
use crate::finding::{OpKind, Phase};
use crate::spec::LossSpec;

pub(in crate::diagnose) struct UnsafeLoss;

impl Rule for UnsafeLoss {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        let Some(stable) = stable_loss(&ctx.case.loss) else {
            return Ok(Vec::new());
        };
        let description = format!("loss {} -> {}", ctx.case.loss.describe(), stable.describe());
        let v = variant(description, ctx.case, |c| c.loss = stable);
        let fixes = tried(CauseKind::UnsafeLoss, vec![v], ctx, runs)?;
        let f = ctx.finding;
        let loss_op = f.op.is_some_and(|o| o.kind == OpKind::Loss);
        let relevance = match f.phase {
            Phase::Loss => Relevance::AtSite(10),
            Phase::Backward if loss_op => Relevance::AtSite(5),
            _ => Relevance::Unrelated,
        };
        Ok(cause(
            CauseKind::UnsafeLoss,
            fixes,
            at_site(ctx, relevance),
            relevance,
        ))
    }
}

/// The stable counterpart of a loss, if it has one.
pub fn stable_loss(loss: &LossSpec) -> Option<LossSpec> {
    Some(match *loss {
        LossSpec::NaiveCrossEntropy { .. } | LossSpec::Nll => LossSpec::CrossEntropy {
            label_smoothing: 0.0,
        },
        LossSpec::Bce { .. } => LossSpec::BceWithLogits,
        LossSpec::LogOneMinus { eps } if eps < 1e-7 => LossSpec::LogOneMinus { eps: 1e-7 },
        LossSpec::KlDiv { eps } if eps < 1e-8 => LossSpec::KlDiv { eps: 1e-8 },
        LossSpec::Mse { root: true, eps } if eps < 1e-8 => LossSpec::Mse {
            root: true,
            eps: 1e-8,
        },
        LossSpec::PoissonNll {
            log_input: false,
            eps,
        } if eps < 1e-8 => LossSpec::PoissonNll {
            log_input: false,
            eps: 1e-8,
        },
        _ => return None,
    })
}
