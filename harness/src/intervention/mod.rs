//! Interventions through the tracer: a whole run with one stage of the
//! user's model guarded, to test an explanation without editing the code.
//!
//! The stage a finding names is the first producer of its non-finite
//! values. Guarding it — its non-finite outputs set to 0, and the
//! non-finite gradients its backward pass hands to the stage before it set
//! to 0 — is what any local repair (an eps, a clamp, a finite mask) does to
//! the rest of the model: it keeps the stage's values finite. If training
//! then stays stable, that stage was the whole problem; if it fails
//! elsewhere, the run says where next. The guard acts where the model calls
//! `tr.record` / `nanhunt::trace`, so it reaches only named stages.
//!
//! With a [`Substitute`] the intervention is the repair itself: the stable
//! formulation the explanation chose, computed where the stage (or the
//! record it reads) is recorded, with its gradient flowing through the
//! repaired op; the guard stays for the patterns no formulation fits.

pub mod rewrite;
pub mod substitute;
pub mod widen;

use crate::finding::{OpSite, Rewrite, RewriteForm, Substitute};
use crate::instrument::Operand;
use crate::spec::HalfType;
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;

/// Which stages a run guards.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Intervention {
    /// The producing stage: its non-finite outputs become 0.
    pub stage: String,
    /// The record before it (what the stage reads): non-finite gradients
    /// that reach it through the stage's backward pass become 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// ±∞ outputs become the dtype's largest finite value instead of 0:
    /// what clamping an exp's input does (a hand-written sigmoid's
    /// 1/(1 + exp(-x)) is then ~0, as it should be, not 1).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub saturate: bool,
    /// The stable formulation substituted at the stage (or at the record it
    /// reads) instead of the guard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub substitute: Option<Substitute>,
    /// The record the substitute recomputes when it is not the stage (the
    /// probabilities a loss stage takes the log of).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// An op of instrumented code to guard instead of a named stage (an
    /// op's name depends on the stage after it; its site does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<OpSite>,
    /// The op that made what the guarded op read: the non-finite gradients
    /// that reach it are set to 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_site: Option<OpSite>,
    /// Every stage's output rounded to this half dtype and back, and the
    /// gradient it hands back with it: PyTorch's half-precision storage in
    /// a run computed in f32 (the framework check of [`crate::fidelity`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<HalfType>,
    /// With `storage`: the optimizer's update computed in the half dtype
    /// too, each op rounded to it, as `torch.optim` updates half-precision
    /// parameters (under mixed precision the update stays in f32).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub half_update: bool,
    /// Ops of instrumented code rewritten in their stable forms (the
    /// repair itself, as the edited lines would compute it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rewrites: Vec<Rewrite>,
}

/// Whether record `name` is an instance of `stage`: the same name, or the
/// same in another repetition of a block (`blocks.4.norm` for
/// `blocks.3.norm`, `h[2]` for `h[0]`). A bug in a block's code is in every
/// copy of it; guarding only the first to fail would move the failure to
/// the next. Digits inside a name (`fc1`, `fc2`) still tell layers apart.
pub fn same_stage(name: &str, stage: &str) -> bool {
    name == stage || (instance_key(name) == instance_key(stage) && instance_key(stage) != stage)
}

/// The name with its purely numeric segments and bracketed indices as `#`.
fn instance_key(name: &str) -> String {
    let segments: Vec<&str> = name
        .split('.')
        .map(|s| {
            if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()) {
                "#"
            } else {
                s
            }
        })
        .collect();
    crate::finding::replace_indices(&segments.join("."), "[#]")
}

impl Intervention {
    /// The guard of `stage` (its non-finite outputs set to 0, or saturated)
    /// and of the gradients it passes back to `input`.
    pub fn guard(stage: &str, input: Option<&str>, saturate: bool) -> Intervention {
        Intervention {
            stage: stage.to_string(),
            input: input.map(str::to_string),
            saturate,
            substitute: None,
            at: None,
            site: None,
            input_site: None,
            storage: None,
            half_update: false,
            rewrites: Vec::new(),
        }
    }

    /// The guard of an instrumented op at `site` (named `stage`) and of
    /// the gradients it passes back to the op at `input` that made what it
    /// read.
    pub fn guard_op(
        stage: &str,
        site: OpSite,
        input: Option<OpSite>,
        saturate: bool,
    ) -> Intervention {
        Intervention {
            site: Some(site),
            input_site: input,
            ..Intervention::guard(stage, None, saturate)
        }
    }

    /// The ops at the rewrites' sites rewritten, in every call of them.
    pub fn rewrite(stage: &str, rewrites: Vec<Rewrite>) -> Intervention {
        Intervention {
            rewrites,
            ..Intervention::guard(stage, None, false)
        }
    }

    /// The tensor an instrumented op at `site` hands on: its rewrite, or
    /// its guard where this intervention guards that op or the op it
    /// read. `inputs` are what it read; `read` keeps the operand of the
    /// op a rewrite reads from, between that op and the rewritten one;
    /// `wide` the f32 values of a region computed in f32, between its ops.
    pub fn apply_op(
        &self,
        site: &OpSite,
        inputs: &[Operand],
        t: Tensor,
        read: &RefCell<Option<Tensor>>,
        wide: &RefCell<widen::Wide>,
    ) -> Result<Tensor> {
        let same = |s: Option<&OpSite>| {
            s.is_some_and(|s| (&s.file, s.line, s.column) == (&site.file, site.line, site.column))
        };
        if !self.rewrites.is_empty() {
            let parts = || self.rewrites.iter().flat_map(Rewrite::parts);
            if parts().any(|r| same(r.from.as_ref())) {
                *read.borrow_mut() = Operand::tensors(inputs).next().cloned();
            }
            let Some(r) = parts().find(|r| same(Some(&r.site))) else {
                return Ok(t);
            };
            if let RewriteForm::Widened { back, entry, .. } = r.form {
                return widen::apply(site, inputs, &t, back, entry, wide);
            }
            let from = read.borrow().clone();
            return rewrite::rewritten(r.form, &site.op, inputs, from.as_ref(), &t);
        }
        let t = match same(self.input_site.as_ref()) && t.dtype().is_float() {
            true => t.contiguous()?.apply_op1(ZeroNonFiniteGrad)?,
            false => t,
        };
        match (same(self.site.as_ref()), self.saturate) {
            (true, false) => finite_or_zero(&t),
            (true, true) => saturated(&t),
            (false, _) => Ok(t),
        }
    }

    /// No stage guarded; every stage's output (and its gradient) stored
    /// in `half` between stages computed at a higher precision.
    pub fn storage(half: HalfType) -> Intervention {
        Intervention {
            storage: Some(half),
            ..Intervention::guard("", None, false)
        }
    }

    /// The dtype the optimizer's update is computed in, where it is not the
    /// parameters' (PyTorch's update of half-precision parameters).
    pub fn update_dtype(&self) -> Option<candle_core::DType> {
        self.storage
            .filter(|_| self.half_update)
            .map(HalfType::dtype)
    }

    /// The tensor a model continues with after recording `t` as `name`.
    /// `read` keeps what the stage read, between the input's record and
    /// the stage's, for a substitute that recomputes the stage.
    pub fn apply(&self, name: &str, t: Tensor, read: &RefCell<Option<Tensor>>) -> Result<Tensor> {
        if let Some(half) = self.storage {
            // to_dtype's backward converts the gradient the same way.
            let stored = t.to_dtype(half.dtype())?.to_dtype(t.dtype())?;
            return match self.stage.is_empty() {
                true => Ok(stored),
                false => self.apply_stage(name, stored, read),
            };
        }
        self.apply_stage(name, t, read)
    }

    fn apply_stage(&self, name: &str, t: Tensor, read: &RefCell<Option<Tensor>>) -> Result<Tensor> {
        match self.substitute {
            Some(s) => self.substituted(s, name, t, read),
            None => self.guarded(name, t),
        }
    }

    fn substituted(
        &self,
        s: Substitute,
        name: &str,
        t: Tensor,
        read: &RefCell<Option<Tensor>>,
    ) -> Result<Tensor> {
        let at_input = self.input.as_deref().is_some_and(|i| same_stage(name, i));
        if at_input && s.moves_input() {
            return substitute::moved(s, &t);
        }
        if at_input {
            *read.borrow_mut() = Some(t.clone());
            // The stage's own code keeps reading it; where that code's
            // output is kept (the rows a mask left finite), its
            // non-finite gradients are not passed on.
            return match s {
                Substitute::SoftmaxOfMaskedRows => t.contiguous()?.apply_op1(ZeroNonFiniteGrad),
                _ => Ok(t),
            };
        }
        let target = self.at.as_deref().unwrap_or(&self.stage);
        if !same_stage(name, target) || s.moves_input() {
            return Ok(t);
        }
        let Some(x) = read.borrow_mut().take() else {
            candle_core::bail!(
                "the repair of `{}` recomputes it from `{}`, which was not recorded before it",
                self.stage,
                self.input.as_deref().unwrap_or("its input")
            );
        };
        let repaired = substitute::stable(s, &x, &t)?;
        if repaired.dims() != t.dims() {
            candle_core::bail!(
                "the repair of `{}` has shape {:?}, the stage {:?}",
                self.stage,
                repaired.dims(),
                t.dims()
            );
        }
        Ok(repaired)
    }

    fn guarded(&self, name: &str, t: Tensor) -> Result<Tensor> {
        let t = match &self.input {
            Some(input) if same_stage(name, input) => {
                t.contiguous()?.apply_op1(ZeroNonFiniteGrad)?
            }
            _ => t,
        };
        match (same_stage(name, &self.stage), self.saturate) {
            (true, false) => finite_or_zero(&t),
            (true, true) => saturated(&t),
            (false, _) => Ok(t),
        }
    }

    /// The intervention in words.
    pub fn describe(&self) -> String {
        if let (Some(half), true) = (self.storage, self.stage.is_empty()) {
            let update = match self.half_update {
                true => ", the optimizer's update computed in it",
                false => "",
            };
            return format!(
                "every stage's output and gradient stored in {} between stages computed in f32{update}",
                half.dtype().as_str()
            );
        }
        if !self.rewrites.is_empty() {
            let each: Vec<String> = self
                .rewrites
                .iter()
                .map(|r| {
                    format!(
                        "`{}` at {} rewritten as `{}` ({})",
                        r.site.short_text(60),
                        r.site.location(),
                        r.code().unwrap_or_default(),
                        r.describe()
                    )
                })
                .collect();
            return format!("{}, for a whole run", each.join("; and "));
        }
        if let Some(s) = self.substitute {
            let formulation = crate::finding::Formulation {
                reads: self.input.clone().unwrap_or_else(|| "x".into()),
                replaces: self.at.clone(),
                substitute: s,
            };
            return format!(
                "`{}` repaired in place, the stable formulation substituted for a whole run: `{}`",
                self.stage,
                formulation.code(&self.stage)
            );
        }
        let outputs = if self.saturate {
            "its infinite outputs set to the dtype's largest finite value and NaN to 0"
        } else {
            "its non-finite outputs set to 0"
        };
        match &self.input {
            Some(input) => format!(
                "`{}` guarded: {outputs}, and the non-finite gradients it passes back to `{input}` set to 0",
                self.stage
            ),
            None => format!("`{}` guarded: {outputs}", self.stage),
        }
    }
}

/// `t` with NaN and ±∞ replaced by 0 (the gradient flows through the
/// finite elements only).
pub fn finite_or_zero(t: &Tensor) -> Result<Tensor> {
    // |NaN| < ∞ is false, as is ∞ < ∞: one comparison finds both.
    let finite = t.abs()?.lt(f64::INFINITY)?;
    finite.where_cond(t, &t.zeros_like()?)
}

/// `t` with ±∞ clamped to the dtype's largest finite magnitude and NaN
/// replaced by 0.
fn saturated(t: &Tensor) -> Result<Tensor> {
    let max = crate::spec::dtype_max(t.dtype());
    // clamp keeps NaN; the second step replaces it.
    finite_or_zero(&t.clamp(-max, max)?)
}

/// The identity forward; backward, the gradient with its non-finite
/// elements set to 0.
struct ZeroNonFiniteGrad;

impl CustomOp1 for ZeroNonFiniteGrad {
    fn name(&self) -> &'static str {
        "zero-non-finite-grad"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("zero-non-finite-grad: a strided input");
        };
        let copied = match s {
            CpuStorage::F32(v) => CpuStorage::F32(v[start..end].to_vec()),
            CpuStorage::F64(v) => CpuStorage::F64(v[start..end].to_vec()),
            CpuStorage::F16(v) => CpuStorage::F16(v[start..end].to_vec()),
            CpuStorage::BF16(v) => CpuStorage::BF16(v[start..end].to_vec()),
            _ => candle_core::bail!("zero-non-finite-grad: not a float tensor"),
        };
        Ok((copied, l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(finite_or_zero(grad)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn every_copy_of_a_repeated_block_is_the_same_stage() {
        assert!(same_stage("blocks.4.rownorm", "blocks.3.rownorm"));
        assert!(same_stage("h[2].attn", "h[0].attn"));
        assert!(same_stage("fc1", "fc1"));
        assert!(
            !same_stage("fc2", "fc1"),
            "digits in a name are another layer"
        );
        assert!(!same_stage("blocks.3.rownorm", "blocks.3.norm"));
        assert!(
            !same_stage("layer0.ln1", "layer1.ln1"),
            "not a numeric segment"
        );
    }

    #[test]
    fn a_substitute_recomputes_the_stage_from_what_it_read_with_its_gradient() {
        // log(softmax(z)) with logits 200 apart: -inf in f32, and the
        // substitute log_softmax(z) is finite with a gradient that flows.
        let z = Var::new(&[[200f32, 0.0]], &Device::Cpu).unwrap();
        let iv = Intervention {
            substitute: Some(Substitute::LogSoftmax),
            ..Intervention::guard("log_probs", Some("logits"), false)
        };
        let read = RefCell::new(None);
        let zs = iv.apply("logits", z.as_tensor().clone(), &read).unwrap();
        let p = iv
            .apply(
                "probs",
                candle_nn::ops::softmax_last_dim(&zs).unwrap(),
                &read,
            )
            .unwrap();
        let y = iv.apply("log_probs", p.log().unwrap(), &read).unwrap();
        let v = y.to_vec2::<f32>().unwrap();
        assert_eq!(v[0], [0.0, -200.0]);
        let g = y.sum_all().unwrap().backward().unwrap();
        let gz = g.get(z.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(gz[0], [-1.0, 1.0]);
        // The stage before its input was recorded is an error, not a guess.
        let fresh = RefCell::new(None);
        assert!(iv.apply("log_probs", p.log().unwrap(), &fresh).is_err());
    }

    #[test]
    fn the_guard_zeroes_non_finite_outputs_and_gradients_only_where_named() {
        let x = Var::new(&[0f32, 1.0, 4.0], &Device::Cpu).unwrap();
        let iv = Intervention::guard("log", Some("x"), false);
        let read = RefCell::new(None);
        let xs = iv.apply("x", x.as_tensor().clone(), &read).unwrap();
        let y = iv.apply("log", xs.log().unwrap(), &read).unwrap();
        assert_eq!(y.to_vec1::<f32>().unwrap(), [0.0, 0.0, 4f32.ln()]);
        let g = y.sum_all().unwrap().backward().unwrap();
        // d log(x)/dx = 1/x: ∞ at 0 (masked forward: 0·∞ = NaN) is set to 0.
        let gx = g.get(x.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(gx, [0.0, 1.0, 0.25]);
        // Unnamed stages pass through untouched.
        let other = iv
            .apply("other", x.as_tensor().log().unwrap(), &read)
            .unwrap();
        assert_eq!(other.to_vec1::<f32>().unwrap()[0], f32::NEG_INFINITY);
    }
}
