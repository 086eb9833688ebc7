//! Per-row statistics a norm's forward pass keeps for its backward pass
//! (layer norm's mean and 1/std, RMS norm's 1/rms), which would otherwise
//! compute them again. candle keeps a custom op in its graph node, so what
//! the op keeps lives as long as the graph.

use std::any::Any;
use std::sync::OnceLock;

/// One value per row, of the type the forward stored (its float type).
#[derive(Default)]
pub(crate) struct KeptRows(OnceLock<Box<dyn Any + Send + Sync>>);

impl KeptRows {
    /// Keeps the forward's values; a second forward of the same op (none
    /// in candle) keeps the first's.
    pub fn keep<S: Any + Send + Sync>(&self, rows: Vec<S>) {
        let _ = self.0.set(Box::new(rows));
    }

    /// The kept values, if they are `S`s and one per row of `rows`.
    pub fn get<S: Any>(&self, rows: usize) -> Option<&[S]> {
        let kept = self.0.get()?.downcast_ref::<Vec<S>>()?;
        (kept.len() == rows).then_some(&kept[..])
    }
}

/// A norm backward test's inputs: 5 rows of `d` (x over ±30), a weight
/// (±2) and a gradient (±1e-3), drawn in that order.
#[cfg(test)]
pub(crate) fn norm_case(rng: &mut crate::rng::Rng, d: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut values = |len: usize, scale: f64| -> Vec<f32> {
        (0..len)
            .map(|_| (rng.uniform_in(-1.0, 1.0) * scale) as f32)
            .collect()
    };
    (values(5 * d, 30.0), values(d, 2.0), values(5 * d, 1e-3))
}
