//! A normalization eps too small (step 4): the built-in families' batch-,
//! layer- and RMS-norm eps below 1e-5, tried at 1e-5, for a failure at a
//! norm stage.

use super::{at_site, cause, tried, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::context::{variant, Variant};
use crate::diagnose::Cause;
use crate::error::Result;
use crate::finding::{OpKind, Phase};
use crate::spec::{Case, ModelSpec, NormPlacement};

pub(in crate::diagnose) struct NormEps;

impl Rule for NormEps {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        let Some(v) = candidate(ctx.case) else {
            return Ok(Vec::new());
        };
        let fixes = tried(CauseKind::NormEps, vec![v], ctx, runs)?;
        let f = ctx.finding;
        let at_norm = f.op.is_some_and(|o| o.kind == OpKind::Norm);
        let relevance = match (f.phase, at_norm) {
            (Phase::Forward | Phase::Backward, true) => Relevance::AtSite(8),
            _ => Relevance::Unrelated,
        };
        Ok(cause(
            CauseKind::NormEps,
            fixes,
            at_site(ctx, relevance),
            relevance,
        ))
    }
}

/// The family's norm eps raised to 1e-5, where it is below.
fn candidate(case: &Case) -> Option<Variant> {
    Some(match &case.model {
        ModelSpec::Cnn(m)
            if m.blocks
                .iter()
                .any(|b| b.batch_norm_eps.is_some_and(|e| e < 1e-5)) =>
        {
            variant("batch-norm eps 1e-5", case, |c| {
                if let ModelSpec::Cnn(m) = &mut c.model {
                    for b in &mut m.blocks {
                        if let Some(e) = &mut b.batch_norm_eps {
                            *e = e.max(1e-5);
                        }
                    }
                }
            })
        }
        ModelSpec::Transformer(t) if t.norm != NormPlacement::None && t.norm_eps < 1e-5 => {
            variant("layer-norm eps 1e-5", case, |c| {
                if let ModelSpec::Transformer(t) = &mut c.model {
                    t.norm_eps = 1e-5;
                }
            })
        }
        ModelSpec::Decoder(d) if d.rms_eps < 1e-5 => variant("RMS-norm eps 1e-5", case, |c| {
            if let ModelSpec::Decoder(d) = &mut c.model {
                d.rms_eps = 1e-5;
            }
        }),
        _ => return None,
    })
}
