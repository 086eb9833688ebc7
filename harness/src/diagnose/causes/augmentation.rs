//! An augmentation produces bad values (step 2): the case without
//! augmentation, and per-sample normalization with a safe eps.

use super::{cause, tried, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::context::variant;
use crate::diagnose::Cause;
use crate::error::Result;
use crate::finding::Phase;
use crate::spec::{Augment, NormalizeSpec};

pub(in crate::diagnose) struct Augmentation;

impl Rule for Augmentation {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        let case = ctx.case;
        if case.augment.is_empty() {
            return Ok(Vec::new());
        }
        let mut variants = vec![variant("augmentation off", case, |c| c.augment.clear())];
        for (i, a) in case.augment.iter().enumerate() {
            if let Augment::Normalize(NormalizeSpec::PerSample { eps }) = a {
                if *eps < 1e-5 {
                    variants.push(variant(
                        format!("augment[{i}] (normalize) eps 1e-5"),
                        case,
                        |c| {
                            c.augment[i] =
                                Augment::Normalize(NormalizeSpec::PerSample { eps: 1e-5 })
                        },
                    ));
                }
            }
        }
        let fixes = tried(CauseKind::Augmentation, variants, ctx, runs)?;
        let mut evidence = Vec::new();
        let before = ctx.raw.nan + ctx.raw.inf;
        let after = ctx.augmented.nan + ctx.augmented.inf;
        if after > before {
            evidence.push(format!(
                "augmentation turns {before} non-finite input values into {after}"
            ));
        }
        let relevance = match ctx.finding.phase {
            Phase::Augment => {
                evidence.push(ctx.at());
                Relevance::AtSite(10)
            }
            _ => Relevance::Unrelated,
        };
        Ok(cause(CauseKind::Augmentation, fixes, evidence, relevance))
    }

    fn explains(&self, phase: Phase) -> bool {
        phase != Phase::Data
    }
}
