//! Attention (step 4): a mask that makes non-finite logits (-inf or
//! f32::MIN masks, padding-only samples that mask every position), and
//! logits without the 1/sqrt(d) scale, each for a failure at the mask, the
//! scores or the softmax.

use super::{at_site, cause, tried, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::context::variant;
use crate::diagnose::Cause;
use crate::error::Result;
use crate::finding::{Finding, OpKind, Phase};
use crate::spec::{AttentionScale as Scale, MaskKind, ModelSpec};

pub(in crate::diagnose) struct AttentionMask;
pub(in crate::diagnose) struct AttentionScale;

/// Whether the failure is in the forward or backward pass of a stage of
/// one of these kinds.
fn at_op(f: &Finding, kinds: &[OpKind]) -> bool {
    matches!(f.phase, Phase::Forward | Phase::Backward)
        && f.op.is_some_and(|o| kinds.contains(&o.kind))
}

impl Rule for AttentionMask {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        let ModelSpec::Encoder(e) = &ctx.case.model else {
            return Ok(Vec::new());
        };
        let mut variants = Vec::new();
        let finite = MaskKind::default();
        if e.mask != finite {
            variants.push(variant(
                "a finite additive mask (-1e4, which f16 holds) instead of -inf or f32::MIN",
                ctx.case,
                |c| {
                    if let ModelSpec::Encoder(e) = &mut c.model {
                        e.mask = finite;
                    }
                },
            ));
        }
        if e.min_length == 0 {
            variants.push(variant(
                "no sample of padding only (min_length 1): no fully masked attention row",
                ctx.case,
                |c| {
                    if let ModelSpec::Encoder(e) = &mut c.model {
                        e.min_length = 1;
                    }
                },
            ));
        }
        let fixes = tried(CauseKind::AttentionMask, variants, ctx, runs)?;
        let relevance = match at_op(ctx.finding, &[OpKind::Mask, OpKind::Softmax]) {
            true => Relevance::AtSite(13),
            false => Relevance::Suspect(10),
        };
        Ok(cause(
            CauseKind::AttentionMask,
            fixes,
            at_site(ctx, relevance),
            relevance,
        ))
    }
}

impl Rule for AttentionScale {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        if ctx.case.model.attention_scale() != Some(Scale::None) {
            return Ok(Vec::new());
        }
        let v = variant(
            "attention logits scaled by 1/sqrt(head width)",
            ctx.case,
            |c| c.model.set_attention_scale(Scale::InvSqrtD),
        );
        let fixes = tried(CauseKind::AttentionScale, vec![v], ctx, runs)?;
        let relevance = match at_op(ctx.finding, &[OpKind::Scores, OpKind::Softmax]) {
            true => Relevance::AtSite(12),
            false => Relevance::Suspect(10),
        };
        Ok(cause(
            CauseKind::AttentionScale,
            fixes,
            at_site(ctx, relevance),
            relevance,
        ))
    }
}
