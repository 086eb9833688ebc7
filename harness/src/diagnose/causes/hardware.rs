//! Device- and thread-count-dependent numerics (step 5): the case on the
//! other device (CPU, or CUDA where it is usable) and on one compute
//! thread, answered by the differential's arms where they ran it. They
//! matter only when the variant changes the verdict.

use super::{cause, tried, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::context::variant;
use crate::diagnose::Cause;
use crate::error::Result;
use crate::finding::Phase;
use crate::spec::DeviceSpec;

pub(in crate::diagnose) struct Device;
pub(in crate::diagnose) struct Threads;

/// A verified variant's cause is a weak suspect; an unverified one, none.
fn informative(kind: CauseKind, fixes: Vec<crate::diagnose::Fix>, points: u8) -> Vec<Cause> {
    let verified = fixes.iter().any(|f| f.verified);
    let relevance = match verified {
        true => Relevance::Suspect(points),
        false => Relevance::Unrelated,
    };
    cause(kind, fixes, Vec::new(), relevance)
}

impl Rule for Device {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        let v = match ctx.case.device {
            DeviceSpec::Cuda(_) => variant("run on CPU", ctx.case, |c| c.device = DeviceSpec::Cpu),
            DeviceSpec::Cpu if crate::device::cuda_usable() => {
                variant("run on cuda:0", ctx.case, |c| {
                    c.device = DeviceSpec::Cuda(0)
                })
            }
            DeviceSpec::Cpu => return Ok(Vec::new()),
        };
        let fixes = tried(CauseKind::Device, vec![v], ctx, runs)?;
        Ok(informative(CauseKind::Device, fixes, 8))
    }

    /// Step 5's arms ran already (the differential): they cost no run.
    fn explains(&self, _phase: Phase) -> bool {
        true
    }
}

impl Rule for Threads {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        let mut v = variant("one compute thread", ctx.case, |_| {});
        v.one_thread = true;
        let fixes = tried(CauseKind::Threads, vec![v], ctx, runs)?;
        Ok(informative(CauseKind::Threads, fixes, 5))
    }

    /// Step 5's arms ran already (the differential): they cost no run.
    fn explains(&self, _phase: Phase) -> bool {
        true
    }
}
