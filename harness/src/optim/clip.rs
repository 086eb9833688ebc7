//! Gradient clipping by global norm or by value.

use crate::spec::ClipSpec;
use candle_core::{Result, Tensor};

/// sqrt(Σ‖g‖²) from per-tensor sums of squares (as the probe computes them).
pub fn global_norm(sum_squares: &[f64]) -> f64 {
    sum_squares.iter().sum::<f64>().sqrt()
}

/// Clips in place of the gradient list. `norm` is their global L2 norm.
/// Norm clipping follows `torch.nn.utils.clip_grad_norm_`:
/// scale = min(1, max_norm / (norm + 1e-6)).
pub fn clip(spec: &ClipSpec, grads: &mut [Tensor], norm: f64) -> Result<()> {
    match *spec {
        ClipSpec::None => {}
        ClipSpec::Norm { max_norm } => {
            let scale = max_norm / (norm + 1e-6);
            if scale < 1.0 {
                for g in grads.iter_mut() {
                    *g = (&*g * scale)?;
                }
            }
        }
        ClipSpec::Value { value } => {
            for g in grads.iter_mut() {
                *g = g.clamp(-value, value)?;
            }
        }
    }
    Ok(())
}
