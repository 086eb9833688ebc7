//! The article's data faults, injected deterministically into a batch.

use super::{HostBatch, HostInput};
use crate::rng::Rng;
use crate::spec::Pathology;

/// Applies the pathologies active at `step` (each with its own RNG stream).
pub fn apply_pathologies(batch: &mut HostBatch, pathologies: &[Pathology], seed: u64, step: usize) {
    for (i, p) in pathologies.iter().enumerate() {
        apply_pathology(batch, i, p, seed, step);
    }
}

/// Applies pathology number `index` of the case (its RNG stream is keyed by
/// the index, so applying them one at a time gives the same batch).
pub fn apply_pathology(batch: &mut HostBatch, index: usize, p: &Pathology, seed: u64, step: usize) {
    if step < p.from_step() {
        return;
    }
    let mut rng = Rng::keyed(seed, &format!("data.pathology.{index}"), step as u64);
    apply_one(batch, p, &mut rng);
}

/// How many of `len` items a fraction selects: at least one.
fn how_many(fraction: f64, len: usize) -> usize {
    ((fraction * len as f64).round() as usize).clamp(1, len.max(1))
}

/// `k` distinct indices of 0..len (partial Fisher–Yates).
fn pick(rng: &mut Rng, len: usize, k: usize) -> Vec<usize> {
    rng.permutation(len).into_iter().take(k).collect()
}

fn apply_one(batch: &mut HostBatch, p: &Pathology, rng: &mut Rng) {
    if let Pathology::LabelOutOfRange {
        fraction, offset, ..
    } = *p
    {
        let (rows, classes) = (batch.labels.len(), batch.classes);
        for r in pick(rng, rows, how_many(fraction, rows)) {
            batch.labels[r] = (classes + offset) as i64;
            // A one-hot of an out-of-range label is all zeros.
            batch.targets[r * classes..(r + 1) * classes].fill(0.0);
        }
        return;
    }
    let HostInput::Real { values, dims } = &mut batch.input else {
        return; // validation rejects value faults on token inputs
    };
    let len = values.len();
    match *p {
        Pathology::Nan { fraction, .. } => {
            for i in pick(rng, len, how_many(fraction, len)) {
                values[i] = f32::NAN;
            }
        }
        Pathology::Inf { fraction, .. } => {
            for i in pick(rng, len, how_many(fraction, len)) {
                values[i] = if rng.uniform() < 0.5 {
                    f32::INFINITY
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
        Pathology::Extreme {
            fraction,
            magnitude,
            ..
        } => {
            for i in pick(rng, len, how_many(fraction, len)) {
                let sign = if rng.uniform() < 0.5 { 1.0 } else { -1.0 };
                values[i] = (sign * magnitude) as f32;
            }
        }
        Pathology::Subnormal { fraction, .. } => {
            for i in pick(rng, len, how_many(fraction, len)) {
                // Between the smallest subnormal and f32::MIN_POSITIVE.
                let m = rng.uniform_in(1e-45, 1.1e-38) as f32;
                values[i] = if rng.uniform() < 0.5 { m } else { -m };
            }
        }
        Pathology::AllZero { fraction, .. } => {
            let rows = dims[0];
            let per = len / rows.max(1);
            for r in pick(rng, rows, how_many(fraction, rows)) {
                values[r * per..(r + 1) * per].fill(0.0);
            }
        }
        Pathology::ConstantFeature { feature, value, .. } => {
            let v = value as f32;
            match dims.len() {
                // (B, C, H, W): one channel.
                4 => {
                    let (c, hw) = (dims[1], dims[2] * dims[3]);
                    for b in 0..dims[0] {
                        let start = (b * c + feature) * hw;
                        values[start..start + hw].fill(v);
                    }
                }
                // (B, S, F) or (B, F): one feature column.
                _ => {
                    let f = *dims.last().expect("inputs have dims");
                    for row in values.chunks_mut(f) {
                        row[feature] = v;
                    }
                }
            }
        }
        Pathology::LabelOutOfRange { .. } => unreachable!("handled above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Generator;
    use crate::spec::Case;

    fn batch_with(p: Pathology) -> HostBatch {
        let mut case = Case::example("cnn").unwrap();
        case.data.pathologies = vec![p];
        let mut b = Generator::new(&case).batch(0, 4);
        apply_pathologies(&mut b, &case.data.pathologies, case.seed, 0);
        b
    }

    fn values(b: &HostBatch) -> &[f32] {
        match &b.input {
            HostInput::Real { values, .. } => values,
            HostInput::Tokens { .. } => panic!("real inputs expected"),
        }
    }

    #[test]
    fn nan_injection_injects_at_least_one() {
        let b = batch_with(Pathology::Nan {
            fraction: 1e-9,
            from_step: 0,
        });
        assert_eq!(values(&b).iter().filter(|v| v.is_nan()).count(), 1);
    }

    #[test]
    fn pathologies_wait_for_their_step() {
        let mut case = Case::example("cnn").unwrap();
        case.data.pathologies = vec![Pathology::Nan {
            fraction: 0.5,
            from_step: 3,
        }];
        let g = Generator::new(&case);
        let mut b = g.batch(2, 4);
        apply_pathologies(&mut b, &case.data.pathologies, case.seed, 2);
        assert!(values(&b).iter().all(|v| v.is_finite()));
    }

    #[test]
    fn constant_channel_is_constant() {
        let b = batch_with(Pathology::ConstantFeature {
            feature: 1,
            value: 7.0,
            from_step: 0,
        });
        let hw = 16 * 16;
        for s in 0..4 {
            let start = (s * 3 + 1) * hw;
            assert!(values(&b)[start..start + hw].iter().all(|&v| v == 7.0));
        }
    }

    #[test]
    fn subnormals_are_subnormal() {
        let b = batch_with(Pathology::Subnormal {
            fraction: 0.1,
            from_step: 0,
        });
        assert!(values(&b).iter().any(|v| v.is_subnormal()));
    }
}
