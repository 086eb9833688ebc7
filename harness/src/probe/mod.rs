//! The per-step stability probe: finiteness scans of tensors and a divergence
//! tracker on the loss.
//!
//! On CPU a scan reads the storage slice directly (one pass, no allocation).
//! On other devices each tensor is reduced on the device in one pass into
//! a row of a small table, copied back with a single synchronization
//! ([`row`]: one kernel launch per tensor on CUDA).

use crate::error::Result;
use candle_core::{CpuStorage, DType, Storage, Tensor};
use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::ops::Range;

mod row;

/// What the probe needs from one tensor, in one pass.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TensorScan {
    /// Σx² over finite entries, accumulated in f64.
    pub sum_sq: f64,
    /// NaN entries.
    pub nan: usize,
    /// ±inf entries.
    pub inf: usize,
    /// max |x| over finite entries; NaN where the scan left it out (the
    /// optimizer's checked pass over finite values, see
    /// [`crate::optim::UpdateScans`]).
    pub max_abs: f64,
}

impl TensorScan {
    /// No NaN and no ±inf.
    pub fn is_finite(&self) -> bool {
        self.nan == 0 && self.inf == 0
    }

    fn add(&mut self, x: f64) {
        if x.is_finite() {
            self.sum_sq += x * x;
            self.max_abs = self.max_abs.max(x.abs());
        } else if x.is_nan() {
            self.nan += 1;
        } else {
            self.inf += 1;
        }
    }
}

/// The global L2 norm of scanned tensors (their Σx², summed in order).
pub fn global_norm(scans: &[TensorScan]) -> f64 {
    scans.iter().map(|s| s.sum_sq).sum::<f64>().sqrt()
}

/// Scans host values.
pub fn scan_host(values: &[f32]) -> TensorScan {
    scan_slice(values, |v| v as f64)
}

/// Scans host values of a kernel float type for what the optimizer's
/// checked pass is checked by: finiteness and Σx², in the probe's lanes
/// (so its bits). While every value is finite `max_abs` is left out
/// (NaN): the checks read it only in half precision, which that pass
/// never takes, and a slice with a non-finite value gets the full,
/// counting scan. Without the max a scan takes about a quarter less time,
/// most of what the guard adds to a small model's step.
pub(crate) fn norm_scan_real<T: crate::kernels::Real>(values: &[T]) -> TensorScan {
    let to_f64 = <T as candle_core::WithDType>::to_f64;
    crate::kernels::wide(
        #[inline(always)]
        || scan_lanes::<T, false>(values, to_f64),
    )
}

/// Whether every value is finite (an optimizer's check of the state it
/// just wrote).
pub(crate) fn all_finite_real<T: crate::kernels::Real>(values: &[T]) -> bool {
    match T::cpu_storage_ref(values) {
        candle_core::CpuStorageRef::F32(v) => all_finite_f32(v),
        candle_core::CpuStorageRef::F64(v) => all_finite_f64(v),
        _ => values.iter().all(|v| v.is_finite()),
    }
}

/// One pass without branches: Σx² in f64 (finite iff every x is finite,
/// since f64 cannot overflow on squares of f32/f16 values) and max |x|, in
/// eight independent lanes so the loop vectorizes (on 256-bit vectors where
/// the CPU has them: the same operations, the same bits). Only a non-finite
/// sum sends the slice through the slow, counting path. Without `MAX` a
/// finite slice's `max_abs` is NaN (not measured).
#[inline]
fn scan_slice<T: Copy>(values: &[T], to_f64: impl Fn(T) -> f64 + Copy) -> TensorScan {
    crate::kernels::wide(
        #[inline(always)]
        || scan_lanes::<T, true>(values, to_f64),
    )
}

/// The lanes of a scan's Σx²: lane k adds the squares of the values at
/// k, k + 8, k + 16, … in that order, and the lanes are summed 0 to 7.
pub(crate) const LANES: usize = 8;

/// [`norm_scan_real`] of `values` from its lanes' sums, added up by the
/// caller in the scan's order (an optimizer's pass adds them in its own
/// loop, as it writes the values): the same bits.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the vector pass's only
pub(crate) fn norm_scan_of_lanes<T: crate::kernels::Real>(
    sum: &[f64; LANES],
    values: &[T],
) -> TensorScan {
    let to_f64 = <T as candle_core::WithDType>::to_f64;
    scan_of_lanes(sum, None, values, to_f64)
}

/// The scan from its lanes: Σx² and, where given, max |x| while every
/// value is finite; else the counting scan of `values`.
#[inline(always)]
fn scan_of_lanes<T: Copy>(
    sum: &[f64; LANES],
    max: Option<f64>,
    values: &[T],
    to_f64: impl Fn(T) -> f64 + Copy,
) -> TensorScan {
    let sum_sq: f64 = sum.iter().sum();
    if sum_sq.is_finite() {
        return TensorScan {
            sum_sq,
            nan: 0,
            inf: 0,
            max_abs: max.unwrap_or(f64::NAN),
        };
    }
    let mut s = TensorScan::default();
    for &v in values {
        s.add(to_f64(v));
    }
    s
}

#[inline(always)]
fn scan_lanes<T: Copy, const MAX: bool>(
    values: &[T],
    to_f64: impl Fn(T) -> f64 + Copy,
) -> TensorScan {
    let mut sum = [0f64; LANES];
    let mut max = [0f64; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    // `a > m` picks as `f64::max` does for every input (a NaN never wins,
    // and `m` is never NaN), in one vector max, with no NaN blend.
    let larger = |m: f64, a: f64| if a > m { a } else { m };
    for chunk in chunks {
        for k in 0..LANES {
            let x = to_f64(chunk[k]);
            sum[k] += x * x;
            if MAX {
                max[k] = larger(max[k], x.abs());
            }
        }
    }
    for (k, &v) in tail.iter().enumerate() {
        let x = to_f64(v);
        sum[k] += x * x;
        if MAX {
            max[k] = larger(max[k], x.abs());
        }
    }
    let max = MAX.then(|| max.iter().copied().fold(0.0, larger));
    scan_of_lanes(&sum, max, values, to_f64)
}

/// Whether every f32 is finite, from the bits alone: an all-ones exponent
/// plus one exponent step carries into the sign bit. Integer lanes with no
/// float compare, so the loop vectorizes fully (the probe's update check
/// reads every parameter and optimizer-state value each step).
fn all_finite_f32(values: &[f32]) -> bool {
    let acc = crate::kernels::wide(
        #[inline(always)]
        || values.iter().fold(0u32, |acc, &v| acc | carry_f32(v)),
    );
    carried_finite_f32(acc)
}

fn all_finite_f64(values: &[f64]) -> bool {
    let acc = crate::kernels::wide(
        #[inline(always)]
        || values.iter().fold(0u64, |acc, &v| acc | carry_f64(v)),
    );
    carried_finite_f64(acc)
}

/// The exponent plus one step: the sign bit is set iff `v` is not finite.
#[inline(always)]
pub(crate) fn carry_f32(v: f32) -> u32 {
    (v.to_bits() & 0x7f80_0000).wrapping_add(0x0080_0000)
}

#[inline(always)]
fn carry_f64(v: f64) -> u64 {
    (v.to_bits() & 0x7ff0_0000_0000_0000).wrapping_add(0x0010_0000_0000_0000)
}

/// Whether the ORed carries of some values say every one was finite.
#[inline(always)]
pub(crate) fn carried_finite_f32(acc: u32) -> bool {
    acc & 0x8000_0000 == 0
}

#[inline(always)]
fn carried_finite_f64(acc: u64) -> bool {
    acc & 0x8000_0000_0000_0000 == 0
}

/// Whether every value of two slices of one length is finite, in one
/// loop (an update's two states: one loop's setup, tail and call instead
/// of two, which on a small model cost more than the values in them).
pub(crate) fn all_finite_pair_real<T: crate::kernels::Real>(a: &[T], b: &[T]) -> bool {
    use candle_core::CpuStorageRef::{F32, F64};
    let b = &b[..a.len()];
    match (T::cpu_storage_ref(a), T::cpu_storage_ref(b)) {
        (F32(a), F32(b)) => crate::kernels::wide(
            #[inline(always)]
            || {
                let bits = |acc, (&x, &y)| acc | carry_f32(x) | carry_f32(y);
                carried_finite_f32(a.iter().zip(b).fold(0u32, bits))
            },
        ),
        (F64(a), F64(b)) => crate::kernels::wide(
            #[inline(always)]
            || {
                let bits = |acc, (&x, &y)| acc | carry_f64(x) | carry_f64(y);
                carried_finite_f64(a.iter().zip(b).fold(0u64, bits))
            },
        ),
        _ => all_finite_real(a) && all_finite_real(b),
    }
}

/// Calls `f` with a contiguous CPU tensor's storage and element range;
/// `None` for other tensors.
fn with_cpu_range<R>(
    t: &Tensor,
    f: impl FnOnce(&CpuStorage, Range<usize>) -> Option<R>,
) -> Option<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return None;
    };
    let (start, end) = layout.contiguous_offsets()?;
    f(cpu, start..end)
}

/// Whether a contiguous f32/f64 CPU tensor is all finite; `None` for the
/// others.
fn finite_cpu(t: &Tensor) -> Option<bool> {
    with_cpu_range(t, |cpu, range| match t.dtype() {
        DType::F32 => Some(all_finite_f32(&cpu.as_slice::<f32>().ok()?[range])),
        DType::F64 => Some(all_finite_f64(&cpu.as_slice::<f64>().ok()?[range])),
        _ => None,
    })
}

/// The index of the first tensor holding a NaN or an infinity, if any
/// (finiteness only; [`scan_all`] gives the statistics).
pub fn first_non_finite(tensors: &[&Tensor]) -> Result<Option<usize>> {
    for (i, t) in tensors.iter().enumerate() {
        let finite = match finite_cpu(t) {
            Some(f) => f,
            None => scan_all(&[t])?[0].is_finite(),
        };
        if !finite {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// The first value of a tensor as f64 (the value of a one-element loss):
/// read in place on the CPU, with no candle op; converted on its device
/// otherwise.
pub fn first_value(t: &Tensor) -> Result<f64> {
    if t.elem_count() == 0 {
        return Err(candle_core::Error::Msg("the tensor has no values".into()).into());
    }
    let in_place = with_cpu_range(t, |cpu, range| {
        let at = range.start;
        Some(match t.dtype() {
            DType::F32 => cpu.as_slice::<f32>().ok()?[at] as f64,
            DType::F64 => cpu.as_slice::<f64>().ok()?[at],
            DType::F16 => cpu.as_slice::<f16>().ok()?[at].to_f64(),
            DType::BF16 => cpu.as_slice::<bf16>().ok()?[at].to_f64(),
            _ => return None,
        })
    });
    match in_place {
        Some(v) => Ok(v),
        None => Ok(t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?[0]),
    }
}

/// Scans a CPU tensor in place; `None` when it is not a contiguous float CPU tensor.
fn scan_cpu(t: &Tensor) -> Option<TensorScan> {
    with_cpu_range(t, |cpu, range| {
        Some(match t.dtype() {
            DType::F32 => scan_slice(&cpu.as_slice::<f32>().ok()?[range], |v| v as f64),
            DType::F64 => scan_slice(&cpu.as_slice::<f64>().ok()?[range], |v| v),
            DType::F16 => scan_slice(&cpu.as_slice::<f16>().ok()?[range], f16::to_f64),
            DType::BF16 => scan_slice(&cpu.as_slice::<bf16>().ok()?[range], bf16::to_f64),
            _ => return None,
        })
    })
}

/// Scans tensors: CPU ones in place, the others reduced on their device and
/// copied back together.
pub fn scan_all(tensors: &[&Tensor]) -> Result<Vec<TensorScan>> {
    let mut out = vec![TensorScan::default(); tensors.len()];
    let mut on_device = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let scanned = match scan_cpu(t) {
            // A strided CPU view (a transposed gradient, say): one copy is far
            // cheaper than the reduction chain of the device path.
            None if t.device().is_cpu() && t.dtype().is_float() => scan_cpu(&t.contiguous()?),
            other => other,
        };
        match scanned {
            Some(s) => out[i] = s,
            None => on_device.push(i),
        }
    }
    if on_device.is_empty() {
        return Ok(out);
    }
    let those: Vec<&Tensor> = on_device.iter().map(|&i| tensors[i]).collect();
    for (&i, r) in on_device.iter().zip(row::rows(&those)?) {
        out[i] = row::scan_of(&r);
    }
    Ok(out)
}

/// One step's probe on an accelerator, in a single device→host copy: the
/// loss value (exact, NaN and ±Inf included) and the scans of `tensors`.
pub fn scan_step(loss: &Tensor, tensors: &[&Tensor]) -> Result<(f64, Vec<TensorScan>)> {
    let all: Vec<&Tensor> = std::iter::once(loss)
        .chain(tensors.iter().copied())
        .collect();
    let table = row::rows(&all)?;
    Ok((table[0][4], table[1..].iter().map(row::scan_of).collect()))
}

/// Summary statistics of an offending tensor (finite entries only for the moments).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorStats {
    /// The tensor's shape.
    pub shape: Vec<usize>,
    /// Its element count.
    pub count: usize,
    /// NaN entries.
    pub nan: usize,
    /// ±inf entries.
    pub inf: usize,
    /// The finite entries' mean.
    #[serde(with = "crate::floats::one")]
    pub mean: f64,
    /// The finite entries' variance.
    #[serde(with = "crate::floats::one")]
    pub var: f64,
    /// The smallest finite entry.
    #[serde(with = "crate::floats::one")]
    pub min: f64,
    /// The largest finite entry.
    #[serde(with = "crate::floats::one")]
    pub max: f64,
}

impl TensorStats {
    /// The statistics of `values`, a tensor of this shape.
    pub fn of_values(shape: &[usize], values: impl Iterator<Item = f64>) -> Self {
        let (mut n, mut sum, mut sum_sq) = (0usize, 0.0, 0.0);
        let (mut nan, mut inf, mut count) = (0, 0, 0);
        let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values {
            count += 1;
            if v.is_nan() {
                nan += 1;
                continue;
            }
            if v.is_infinite() {
                inf += 1;
                continue;
            }
            n += 1;
            sum += v;
            sum_sq += v * v;
            min = min.min(v);
            max = max.max(v);
        }
        let mean = if n > 0 { sum / n as f64 } else { f64::NAN };
        let var = if n > 0 {
            (sum_sq / n as f64 - mean * mean).max(0.0)
        } else {
            f64::NAN
        };
        TensorStats {
            shape: shape.to_vec(),
            count,
            nan,
            inf,
            mean,
            var,
            min: if n > 0 { min } else { f64::NAN },
            max: if n > 0 { max } else { f64::NAN },
        }
    }

    /// The statistics of a tensor (copied to the host).
    pub fn of_tensor(t: &Tensor) -> Result<Self> {
        let values = t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        Ok(TensorStats::of_values(t.dims(), values.into_iter()))
    }

    /// The statistics of f32 host values.
    pub fn of_host(shape: &[usize], values: &[f32]) -> Self {
        TensorStats::of_values(shape, values.iter().map(|&v| v as f64))
    }

    /// The same statistics bit for bit (a NaN moment equals a NaN one).
    pub fn same_bits(&self, other: &TensorStats) -> bool {
        let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        self.shape == other.shape
            && (self.count, self.nan, self.inf) == (other.count, other.nan, other.inf)
            && same(self.mean, other.mean)
            && same(self.var, other.var)
            && same(self.min, other.min)
            && same(self.max, other.max)
    }
}

/// Divergence as fastai and Lightning's LR finders define it: the debiased
/// exponential moving average of the loss (β = 0.98) exceeds `factor` × the
/// best smoothed value seen. Written as `smoothed - best > (factor - 1) ·
/// scale`, with scale = max(|best|, FLOOR_FRACTION · |first loss|): the same
/// rule while best > 0, meaningful for losses that can be negative, and a run
/// that has already fitted (best ≈ 0.001 from a start of 3) is not called
/// diverged by a batch at 0.01; it must climb back towards its starting loss.
///
/// Crossing the line is not yet divergence: a healthy run's early spike
/// (RMSprop or Adam at a high rate) crosses it and is back below the best
/// of its crossing within tens of steps. A crossing diverged when it has
/// not recovered [`LOOKAHEAD`] steps later (the average's memory), when the
/// run ends first, or at once when the smoothed loss is past the line drawn
/// with `factor²`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DivergenceTracker {
    factor: f64,
    avg: f64,
    steps: i32,
    #[serde(with = "crate::floats::one")]
    best: f64,
    #[serde(with = "crate::floats::one")]
    first: f64,
    /// The best smoothed loss when the line was crossed (a crossing that
    /// has not recovered yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    best_at_crossing: Option<f64>,
    /// The count of losses pushed when it was crossed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    crossed_at: Option<i32>,
}

const SMOOTHING: f64 = 0.98;
/// The count of losses from which the average's bias correction
/// `1 − SMOOTHING^steps` rounds to exactly 1 (SMOOTHING^steps ≤ 2⁻⁵⁴).
const CORRECTED_UNTIL: i32 = 1853;
/// The fraction of the first loss below which `best` stops shrinking the scale.
const FLOOR_FRACTION: f64 = 0.25;
/// Steps a crossing has to recover in: the moving average's memory, 1/(1 − β).
pub const LOOKAHEAD: usize = 50;

/// Why a crossing is judged diverged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judged {
    /// The smoothed loss is past the line drawn with factor².
    FarAbove,
    /// Not recovered [`LOOKAHEAD`] steps after the crossing.
    NotRecovered,
    /// Not recovered when the run ended.
    RunEnded,
}

/// A crossing judged diverged: the smoothed loss now, the best it had
/// reached when it crossed, and how many steps after the crossing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Diverged {
    /// The smoothed loss now.
    pub smoothed: f64,
    /// The best smoothed loss when it crossed.
    pub best: f64,
    /// Steps since the crossing.
    pub steps_after: usize,
    /// How it was judged.
    pub judged: Judged,
}

impl DivergenceTracker {
    /// A tracker that flags a smoothed loss above `factor` × its best.
    pub fn new(factor: f64) -> Self {
        DivergenceTracker {
            factor,
            avg: 0.0,
            steps: 0,
            best: f64::INFINITY,
            first: f64::NAN,
            best_at_crossing: None,
            crossed_at: None,
        }
    }

    /// Adds a finite loss; returns the judgement when a crossing of the
    /// line diverged. A crossing that recovers (the smoothed loss back at
    /// or below the best of its crossing) is forgotten.
    pub fn push(&mut self, loss: f64) -> Option<Diverged> {
        if self.steps == 0 {
            self.first = loss;
        }
        self.steps += 1;
        self.avg = SMOOTHING * self.avg + (1.0 - SMOOTHING) * loss;
        let smoothed = self.smoothed();
        let judged = self.steps > 1;
        let far = judged && self.above_line(smoothed, self.factor * self.factor);
        if judged && self.best_at_crossing.is_none() && self.above_line(smoothed, self.factor) {
            self.best_at_crossing = Some(self.best);
            self.crossed_at = Some(self.steps);
        }
        self.best = self.best.min(smoothed);
        let best = self.best_at_crossing?;
        if smoothed <= best {
            self.best_at_crossing = None;
            self.crossed_at = None;
            return None;
        }
        let steps_after = self.steps_after_crossing();
        let judged = match (far, steps_after >= LOOKAHEAD) {
            (true, _) => Judged::FarAbove,
            (false, true) => Judged::NotRecovered,
            (false, false) => return None,
        };
        Some(Diverged {
            smoothed,
            best,
            steps_after,
            judged,
        })
    }

    /// At the end of a run: the crossing that had not recovered, if any.
    pub fn at_end(&self) -> Option<Diverged> {
        let best = self.best_at_crossing?;
        Some(Diverged {
            smoothed: self.smoothed(),
            best,
            steps_after: self.steps_after_crossing(),
            judged: Judged::RunEnded,
        })
    }

    /// Whether the last loss pushed crossed the line (its crossing pending).
    pub fn crossed_now(&self) -> bool {
        self.crossed_at == Some(self.steps)
    }

    /// Whether a crossing is waiting to be judged.
    pub fn pending(&self) -> bool {
        self.best_at_crossing.is_some()
    }

    fn steps_after_crossing(&self) -> usize {
        (self.steps - self.crossed_at.unwrap_or(self.steps)).max(0) as usize
    }

    /// The bias-corrected moving average of the losses so far.
    fn smoothed(&self) -> f64 {
        // From CORRECTED_UNTIL steps on the correction is exactly 1 in f64:
        // the same bits without a `powi` of a growing count every step.
        if self.steps >= CORRECTED_UNTIL {
            return self.avg;
        }
        self.avg / (1.0 - SMOOTHING.powi(self.steps))
    }

    /// Whether `smoothed` lies more than (factor − 1) × the scale above the best.
    fn above_line(&self, smoothed: f64, factor: f64) -> bool {
        let scale = self
            .best
            .abs()
            .max(FLOOR_FRACTION * self.first.abs())
            .max(f64::MIN_POSITIVE);
        smoothed - self.best > (factor - 1.0) * scale
    }

    /// Whether a run that crossed the divergence line has not recovered:
    /// its smoothed loss now is still above the best it had reached when it
    /// crossed. Heavy-ball momentum near its threshold rings for tens of
    /// steps and then converges (recovered); a run knocked back to chance
    /// by a spike has not. Judged over a whole run, only the latter diverged.
    pub fn still_diverged(&self) -> bool {
        self.pending()
    }

    /// The factor of the divergence line.
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// The best smoothed loss so far.
    pub fn best(&self) -> f64 {
        self.best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every vector build scans to the same bits: Σx² (the probe's lanes,
    /// in their order), max |x| and the counts, in f32, f64 and f16, with
    /// and without non-finite values, over lengths that leave tails.
    #[test]
    fn every_vector_build_scans_to_the_same_bits() {
        use crate::kernels::{with_vectors, Vectors};
        let dev = candle_core::Device::Cpu;
        let mut rng = crate::rng::Rng::new(5);
        let mut tensors = Vec::new();
        for n in [1usize, 7, 8, 15, 16, 17, 40, 1000, 4099] {
            let v: Vec<f64> = (0..n).map(|_| rng.normal() * 1e3).collect();
            let mut bad = v.clone();
            bad[n / 2] = f64::NAN;
            bad[n - 1] = f64::NEG_INFINITY;
            for values in [v, bad] {
                let t = Tensor::from_vec(values, n, &dev).unwrap();
                for dtype in [DType::F64, DType::F32, DType::F16] {
                    tensors.push(t.to_dtype(dtype).unwrap());
                }
            }
        }
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let bits = |vectors| {
            with_vectors(vectors, || scan_all(&refs).unwrap())
                .iter()
                .map(|s| (s.sum_sq.to_bits(), s.max_abs.to_bits(), s.nan, s.inf))
                .collect::<Vec<_>>()
        };
        let widest = bits(Vectors::Widest);
        assert_eq!(widest, bits(Vectors::Avx2));
        assert_eq!(widest, bits(Vectors::Baseline));
        let host: Vec<f32> = (0..4099).map(|i| (i as f32 - 2000.0) * 0.37).collect();
        let host_bits = |vectors| {
            let s = with_vectors(vectors, || scan_host(&host));
            (s.sum_sq.to_bits(), s.max_abs.to_bits())
        };
        assert_eq!(host_bits(Vectors::Widest), host_bits(Vectors::Baseline));
        assert_eq!(host_bits(Vectors::Widest), host_bits(Vectors::Avx2));
    }

    #[test]
    fn first_value_reads_in_place_and_refuses_an_empty_tensor() {
        let dev = candle_core::Device::Cpu;
        let x = Tensor::new(&[1.5f32, -2.25, 3.0], &dev).unwrap();
        assert_eq!(first_value(&x.narrow(0, 1, 1).unwrap()).unwrap(), -2.25);
        let loss = Tensor::new(f32::INFINITY, &dev).unwrap();
        assert_eq!(first_value(&loss).unwrap(), f64::INFINITY);
        let half = x.to_dtype(DType::F16).unwrap().narrow(0, 2, 1).unwrap();
        assert_eq!(first_value(&half).unwrap(), 3.0);
        // A strided view goes through the copy and gives the same value.
        let m = Tensor::new(&[[1f64, 2.], [3., 4.]], &dev)
            .unwrap()
            .t()
            .unwrap();
        assert_eq!(first_value(&m.narrow(0, 1, 1).unwrap()).unwrap(), 2.0);
        assert!(first_value(&x.narrow(0, 0, 0).unwrap()).is_err());
    }

    #[test]
    fn the_bit_test_finds_exactly_the_non_finite_values() {
        let specials = [
            0.0,
            -0.0,
            1.0,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-45,
            -1e-45,
        ];
        assert!(all_finite_f32(&specials));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN] {
            let mut v = specials.to_vec();
            v.insert(3, bad);
            assert!(!all_finite_f32(&v), "{bad}");
            let v64: Vec<f64> = v.iter().map(|&x| x as f64).collect();
            assert!(!all_finite_f64(&v64), "{bad}");
        }
        assert!(all_finite_f64(&[f64::MAX, f64::MIN, 5e-324, -0.0]));
        let t = Tensor::new(&[[1f32, 2.], [3., f32::NAN]], &candle_core::Device::Cpu).unwrap();
        let ok = Tensor::new(&[1f32, 2.], &candle_core::Device::Cpu).unwrap();
        assert_eq!(first_non_finite(&[&ok, &t]).unwrap(), Some(1));
        assert_eq!(first_non_finite(&[&ok, &ok]).unwrap(), None);
        let half = ok.to_dtype(DType::F16).unwrap();
        assert_eq!(first_non_finite(&[&half]).unwrap(), None);
    }
    use candle_core::Device;

    #[test]
    fn cpu_scan_counts_non_finite_and_sums_squares() {
        let t = Tensor::new(&[1f32, -2.0, f32::NAN, f32::INFINITY, 3.0], &Device::Cpu).unwrap();
        let s = scan_all(&[&t]).unwrap()[0];
        assert_eq!((s.nan, s.inf), (1, 1));
        assert_eq!(s.sum_sq, 14.0);
        assert_eq!(s.max_abs, 3.0);
    }

    #[test]
    fn fast_and_slow_paths_agree() {
        let mut v: Vec<f32> = (0..37).map(|i| i as f32 - 18.5).collect();
        let fast = scan_host(&v);
        assert_eq!(
            fast.sum_sq,
            v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>()
        );
        assert_eq!((fast.nan, fast.inf, fast.max_abs), (0, 0, 18.5));
        v[36] = f32::NAN;
        v[3] = f32::NEG_INFINITY;
        let slow = scan_host(&v);
        assert_eq!((slow.nan, slow.inf), (1, 1));
        assert!(slow.sum_sq.is_finite());
    }

    #[test]
    fn the_device_row_holds_the_scan_and_the_raw_sum() {
        // The device path run on CPU tensors (as a tensor of another device
        // without the kernel is): finite, NaN, an f32 overflow of Σx²,
        // ±Inf, half precision, a strided view and integers, each in its place.
        let dev = &Device::Cpu;
        let finite = Tensor::new(&[3f32, -4.0, 0.5], dev).unwrap();
        let nan = Tensor::new(&[1f32, f32::NAN, 2.0], dev).unwrap();
        let huge = Tensor::new(&[3e30f32, 1.0], dev).unwrap();
        let inf = Tensor::new(&[f32::INFINITY, -1.0, f32::NEG_INFINITY], dev).unwrap();
        let half = finite.to_dtype(DType::F16).unwrap();
        let strided = Tensor::new(&[[1f64, 2.], [3., -4.]], dev)
            .unwrap()
            .t()
            .unwrap();
        let ints = Tensor::new(&[3u32, 4], dev).unwrap();
        let all = [&finite, &nan, &huge, &inf, &half, &strided, &ints];
        let table = row::rows(&all).unwrap();
        assert_eq!(table[0], [25.25, 0.0, 0.0, 4.0, -0.5]);
        assert_eq!(table[1][..4], [5.0, 1.0, 0.0, 2.0]);
        assert!(table[1][4].is_nan(), "the raw sum keeps the NaN");
        let h = 3e30f32 as f64;
        assert_eq!(table[2][..4], [h * h + 1.0, 0.0, 0.0, h]);
        assert_eq!(table[3][..4], [1.0, 0.0, 2.0, 1.0]);
        assert!(table[3][4].is_nan(), "inf - inf");
        assert_eq!(table[4], table[0]);
        assert_eq!(table[5], [30.0, 0.0, 0.0, 4.0, 2.0]);
        assert_eq!(table[6], [25.0, 0.0, 0.0, 4.0, 7.0]);
        // The same bits as the in-place scan.
        for (t, r) in all.iter().zip(&table) {
            let s = scan_all(&[t]).unwrap()[0];
            let r = row::scan_of(r);
            assert_eq!(
                (r.sum_sq.to_bits(), r.max_abs.to_bits()),
                (s.sum_sq.to_bits(), s.max_abs.to_bits())
            );
            assert_eq!((r.nan, r.inf), (s.nan, s.inf));
        }
        // The step scan returns a scalar loss exactly, sign and all.
        let loss = Tensor::new(-0.1234567f64, dev).unwrap();
        let (value, scans) = scan_step(&loss, &[&nan]).unwrap();
        assert_eq!(value, -0.1234567);
        assert_eq!((scans[0].nan, scans[0].inf, scans[0].sum_sq), (1, 0, 5.0));
        let neg = Tensor::new(f32::NEG_INFINITY, dev).unwrap();
        assert_eq!(scan_step(&neg, &[]).unwrap().0, f64::NEG_INFINITY);
        let signed_nan = Tensor::new(-f32::NAN, dev).unwrap();
        assert!(scan_step(&signed_nan, &[]).unwrap().0.is_sign_negative());
    }

    #[test]
    fn scans_half_precision_and_strided_views() {
        let t = Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        assert_eq!(scan_all(&[&t]).unwrap()[0].sum_sq, 30.0);
        let tt = t.t().unwrap(); // not contiguous: scanned from a copy
        assert_eq!(scan_all(&[&tt]).unwrap()[0].sum_sq, 30.0);
    }

    #[test]
    fn the_bias_correction_is_exactly_one_from_corrected_until_on() {
        // So skipping it from there gives the same bits; one step earlier
        // it still moves the average.
        assert_ne!(1.0 - SMOOTHING.powi(CORRECTED_UNTIL - 1), 1.0);
        for steps in (CORRECTED_UNTIL..1_000_000).chain([i32::MAX - 1, i32::MAX]) {
            assert_eq!(1.0 - SMOOTHING.powi(steps), 1.0, "at {steps} steps");
        }
        let mut d = DivergenceTracker::new(4.0);
        for step in 0..CORRECTED_UNTIL + 2 {
            d.push(1.0 + (step % 7) as f64);
            let full = d.avg / (1.0 - SMOOTHING.powi(d.steps));
            assert_eq!(d.smoothed().to_bits(), full.to_bits(), "at {step}");
        }
    }

    #[test]
    fn divergence_tracker_flags_a_blow_up_not_noise() {
        let mut d = DivergenceTracker::new(4.0);
        for l in [2.0, 1.9, 2.1, 1.8, 1.7, 1.9] {
            assert!(d.push(l).is_none());
        }
        let mut flagged = false;
        for l in [10.0, 100.0, 1000.0, 1e4] {
            flagged |= d.push(l).is_some();
        }
        assert!(flagged);
    }

    #[test]
    fn a_fitted_run_does_not_diverge_on_small_noise() {
        let mut d = DivergenceTracker::new(4.0);
        assert!(d.push(3.0).is_none());
        for _ in 0..200 {
            assert!(d.push(0.001).is_none());
        }
        // 10x the best, but far below the start: noise, not divergence.
        for _ in 0..50 {
            assert!(d.push(0.05).is_none());
        }
        // Back above the starting loss: divergence.
        assert!((0..100).any(|_| d.push(10.0).is_some()));
    }

    /// RMSprop at lr 0.1 on a healthy classifier: an early spike over the
    /// line, then it trains.
    #[test]
    fn a_spike_that_recovers_within_the_look_ahead_is_not_divergence() {
        let mut d = DivergenceTracker::new(4.0);
        for l in [1.98, 9.0, 16.0, 4.3, 15.0] {
            assert!(d.push(l).is_none());
        }
        assert!(d.pending(), "the spike crossed the line");
        for _ in 0..200 {
            assert!(d.push(0.01).is_none());
        }
        assert!(!d.pending() && d.at_end().is_none());
    }

    #[test]
    fn a_crossing_not_recovered_is_judged_after_the_look_ahead_or_at_the_end() {
        let mut d = DivergenceTracker::new(4.0);
        for _ in 0..10 {
            assert!(d.push(1.0).is_none());
        }
        // A plateau at 6x crosses the 4x line, and is not judged at once.
        for pushed in 0.. {
            assert!(d.push(6.0).is_none() && pushed < 200);
            if d.crossed_now() {
                break;
            }
        }
        let at_end = d.at_end().expect("pending");
        assert_eq!((at_end.judged, at_end.steps_after), (Judged::RunEnded, 0));
        let judged = (1..=LOOKAHEAD).find_map(|k| d.push(6.0).map(|j| (k, j)));
        let (k, j) = judged.expect("judged within the look-ahead");
        assert_eq!(
            (k, j.judged, j.steps_after),
            (LOOKAHEAD, Judged::NotRecovered, LOOKAHEAD)
        );
        assert!((j.best - 1.0).abs() < 1e-12, "{j:?}");
    }

    #[test]
    fn a_loss_far_past_the_line_is_divergence_at_once() {
        let mut d = DivergenceTracker::new(4.0);
        for _ in 0..10 {
            d.push(1.0);
        }
        let j = d.push(1e4).expect("at once");
        assert_eq!((j.judged, j.steps_after), (Judged::FarAbove, 0));
    }

    #[test]
    fn stats_ignore_non_finite_in_moments() {
        let s = TensorStats::of_host(&[4], &[1.0, 3.0, f32::NAN, f32::INFINITY]);
        assert_eq!((s.nan, s.inf, s.count), (1, 1, 4));
        assert_eq!((s.mean, s.var, s.min, s.max), (2.0, 1.0, 1.0, 3.0));
    }
}
