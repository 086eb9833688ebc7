//! Seeded batch augmentations, applied on the host after the pathologies.
//! Each augmentation draws from its own stream keyed by (seed, index, step).

use crate::data::{HostBatch, HostInput};
use crate::rng::Rng;
use crate::spec::{Augment, NormalizeSpec};

/// Applies a whole pipeline, in order, to the batch of `step`.
pub fn apply_all(batch: &mut HostBatch, pipeline: &[Augment], seed: u64, step: usize) {
    for (i, aug) in pipeline.iter().enumerate() {
        apply(batch, aug, seed, i, step);
    }
}

/// The largest input magnitude for which augmentations are documented to
/// keep finite inputs finite.
pub const DOCUMENTED_MAX_INPUT: f64 = 1e6;

/// Whether an augmentation (with parameters `validate` accepts) is
/// documented to keep every finite input with |x| ≤ [`DOCUMENTED_MAX_INPUT`]
/// finite. The exceptions are the normalization traps: a per-sample eps
/// below 1e-6 divides a constant sample by ~0, and a per-channel std below
/// 1e-3 divides by ~0. The `augmentations` fuzz target checks this.
pub fn documented_safe(aug: &Augment) -> bool {
    match aug {
        Augment::Normalize(NormalizeSpec::PerSample { eps }) => *eps >= 1e-6,
        Augment::Normalize(NormalizeSpec::PerChannel { std, .. }) => std.iter().all(|&s| s >= 1e-3),
        _ => true,
    }
}

/// Applies one augmentation (index `i` of the pipeline) to the batch of `step`.
pub fn apply(batch: &mut HostBatch, aug: &Augment, seed: u64, i: usize, step: usize) {
    let mut rng = Rng::keyed(seed, &format!("augment.{i}"), step as u64);
    if let Augment::Mixup { alpha } = *aug {
        mixup(batch, alpha, &mut rng);
        return;
    }
    let HostInput::Real { values, dims } = &mut batch.input else {
        return; // validation keeps augmentations away from token inputs
    };
    let rows = dims[0];
    let per = values.len() / rows.max(1);
    for sample in values.chunks_mut(per.max(1)) {
        match aug {
            Augment::RandomErasing {
                p,
                scale,
                ratio,
                value,
            } => random_erasing(sample, dims, *p, *scale, *ratio, *value, &mut rng),
            Augment::ColorJitter {
                brightness,
                contrast,
                saturation,
                hue,
            } => color_jitter(
                sample,
                dims,
                [*brightness, *contrast, *saturation, *hue],
                &mut rng,
            ),
            Augment::RandomAffine {
                degrees,
                translate,
                scale,
                shear,
            } => random_affine(sample, dims, *degrees, *translate, *scale, *shear, &mut rng),
            Augment::GaussianNoise { std } => {
                for v in sample.iter_mut() {
                    *v += (std * rng.normal()) as f32;
                }
            }
            Augment::Normalize(spec) => normalize(sample, dims, spec),
            Augment::TimeMask {
                p,
                max_width,
                value,
            } => {
                if rng.uniform() < *p {
                    let (seq, feat) = (dims[1], dims[2]);
                    let width = 1 + rng.below((*max_width).min(seq));
                    let start = rng.below(seq - width + 1);
                    sample[start * feat..(start + width) * feat].fill(*value as f32);
                }
            }
            Augment::Mixup { .. } => unreachable!("handled above"),
        }
    }
}

/// torchvision's RandomErasing: up to 10 tries to fit a rectangle of the drawn
/// area and aspect ratio; a scale of 1.0 erases the whole image.
fn random_erasing(
    img: &mut [f32],
    dims: &[usize],
    p: f64,
    scale: [f64; 2],
    ratio: [f64; 2],
    value: f64,
    rng: &mut Rng,
) {
    if rng.uniform() >= p {
        return;
    }
    let (c, h, w) = (dims[1], dims[2], dims[3]);
    let area = (h * w) as f64;
    for _ in 0..10 {
        let target = area * rng.uniform_in(scale[0], scale[1]);
        let log_r = rng.uniform_in(ratio[0].ln(), ratio[1].ln());
        let aspect = log_r.exp();
        let eh = (target * aspect).sqrt().round() as usize;
        let ew = (target / aspect).sqrt().round() as usize;
        if eh == 0 || ew == 0 || eh > h || ew > w {
            continue;
        }
        let top = rng.below(h - eh + 1);
        let left = rng.below(w - ew + 1);
        for ch in 0..c {
            for y in top..top + eh {
                let row = (ch * h + y) * w;
                img[row + left..row + left + ew].fill(value as f32);
            }
        }
        return;
    }
}

fn factor(rng: &mut Rng, x: f64) -> f64 {
    rng.uniform_in((1.0 - x).max(0.0), 1.0 + x)
}

/// Brightness, contrast, saturation and hue, in that order (no clamping to
/// [0, 1]: synthetic images are not in that range).
fn color_jitter(img: &mut [f32], dims: &[usize], amounts: [f64; 4], rng: &mut Rng) {
    let [brightness, contrast, saturation, hue] = amounts;
    let (c, hw) = (dims[1], dims[2] * dims[3]);
    let b = factor(rng, brightness) as f32;
    img.iter_mut().for_each(|v| *v *= b);
    let k = factor(rng, contrast) as f32;
    let mean = img.iter().sum::<f32>() / img.len() as f32;
    img.iter_mut().for_each(|v| *v = mean + k * (*v - mean));
    if c != 3 {
        return;
    }
    let s = factor(rng, saturation) as f32;
    let turn = rng.uniform_in(-hue, hue);
    let (cos, sin) = (
        (turn * std::f64::consts::TAU).cos() as f32,
        (turn * std::f64::consts::TAU).sin() as f32,
    );
    for i in 0..hw {
        let (r, g, bl) = (img[i], img[hw + i], img[2 * hw + i]);
        let gray = 0.299 * r + 0.587 * g + 0.114 * bl;
        let (r, g, bl) = (
            gray + s * (r - gray),
            gray + s * (g - gray),
            gray + s * (bl - gray),
        );
        // Hue: rotate the chroma plane of YIQ.
        let y = 0.299 * r + 0.587 * g + 0.114 * bl;
        let ci = 0.596 * r - 0.274 * g - 0.322 * bl;
        let cq = 0.211 * r - 0.523 * g + 0.312 * bl;
        let (i2, q2) = (ci * cos - cq * sin, ci * sin + cq * cos);
        img[i] = y + 0.956 * i2 + 0.621 * q2;
        img[hw + i] = y - 0.272 * i2 - 0.647 * q2;
        img[2 * hw + i] = y - 1.106 * i2 + 1.703 * q2;
    }
}

/// Inverse-mapped affine transform about the centre, bilinear sampling, zero
/// fill. A degenerate matrix gives non-finite coordinates and NaN pixels,
/// which is the trap the source article warns about.
fn random_affine(
    img: &mut [f32],
    dims: &[usize],
    degrees: f64,
    translate: [f64; 2],
    scale: [f64; 2],
    shear: f64,
    rng: &mut Rng,
) {
    let (c, h, w) = (dims[1], dims[2], dims[3]);
    let angle = rng.uniform_in(-degrees, degrees).to_radians();
    let tx = rng.uniform_in(-translate[0], translate[0]) * w as f64;
    let ty = rng.uniform_in(-translate[1], translate[1]) * h as f64;
    let s = rng.uniform_in(scale[0], scale[1]);
    let sh = rng.uniform_in(-shear, shear).to_radians();
    // Forward matrix M = R(angle) · Shear_x(sh) · s.
    let (ca, sa) = (angle.cos(), angle.sin());
    let m = [
        [s * ca, s * (ca * sh.tan() - sa)],
        [s * sa, s * (sa * sh.tan() + ca)],
    ];
    let det = m[0][0] * m[1][1] - m[0][1] * m[1][0];
    let inv = [
        [m[1][1] / det, -m[0][1] / det],
        [-m[1][0] / det, m[0][0] / det],
    ];
    let (cx, cy) = ((w as f64 - 1.0) / 2.0, (h as f64 - 1.0) / 2.0);
    let src = img.to_vec();
    for ch in 0..c {
        let plane = &src[ch * h * w..(ch + 1) * h * w];
        for y in 0..h {
            for x in 0..w {
                let (dx, dy) = (x as f64 - cx - tx, y as f64 - cy - ty);
                let sx = inv[0][0] * dx + inv[0][1] * dy + cx;
                let sy = inv[1][0] * dx + inv[1][1] * dy + cy;
                img[(ch * h + y) * w + x] = bilinear(plane, h, w, sx, sy);
            }
        }
    }
}

fn bilinear(plane: &[f32], h: usize, w: usize, x: f64, y: f64) -> f32 {
    if !x.is_finite() || !y.is_finite() {
        return f32::NAN;
    }
    let (x0, y0) = (x.floor(), y.floor());
    let (fx, fy) = (x - x0, y - y0);
    let at = |xi: f64, yi: f64| -> f64 {
        if xi < 0.0 || yi < 0.0 || xi >= w as f64 || yi >= h as f64 {
            0.0
        } else {
            plane[yi as usize * w + xi as usize] as f64
        }
    };
    let v = at(x0, y0) * (1.0 - fx) * (1.0 - fy)
        + at(x0 + 1.0, y0) * fx * (1.0 - fy)
        + at(x0, y0 + 1.0) * (1.0 - fx) * fy
        + at(x0 + 1.0, y0 + 1.0) * fx * fy;
    v as f32
}

/// (x - mean) / (std + eps) per channel, or per sample with its own statistics.
fn normalize(sample: &mut [f32], dims: &[usize], spec: &NormalizeSpec) {
    match spec {
        NormalizeSpec::PerChannel { mean, std } => {
            if dims.len() == 4 {
                let hw = dims[2] * dims[3];
                for (ch, plane) in sample.chunks_mut(hw).enumerate() {
                    let (m, s) = (mean[ch] as f32, std[ch] as f32);
                    plane.iter_mut().for_each(|v| *v = (*v - m) / s);
                }
            } else {
                let f = *dims.last().expect("inputs have dims");
                for row in sample.chunks_mut(f) {
                    for (j, v) in row.iter_mut().enumerate() {
                        *v = (*v - mean[j] as f32) / std[j] as f32;
                    }
                }
            }
        }
        NormalizeSpec::PerSample { eps } => {
            let n = sample.len() as f64;
            let mean = sample.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = sample
                .iter()
                .map(|&v| (v as f64 - mean).powi(2))
                .sum::<f64>()
                / n;
            let denom = (var.sqrt() + eps) as f32;
            let mean = mean as f32;
            sample.iter_mut().for_each(|v| *v = (*v - mean) / denom);
        }
    }
}

fn mixup(batch: &mut HostBatch, alpha: f64, rng: &mut Rng) {
    let HostInput::Real { values, dims } = &mut batch.input else {
        return;
    };
    let rows = dims[0];
    let lam = rng.beta(alpha, alpha);
    let perm = rng.permutation(rows);
    let per = values.len() / rows.max(1);
    let src = values.clone();
    for (r, &j) in perm.iter().enumerate() {
        for k in 0..per {
            values[r * per + k] =
                (lam * src[r * per + k] as f64 + (1.0 - lam) * src[j * per + k] as f64) as f32;
        }
    }
    // Target rows per sample (per-token heads have several rows per sample).
    let c = batch.classes;
    let tr = batch.targets.len() / c / rows.max(1);
    let mut mixed = vec![0f32; batch.targets.len()];
    for (r, &j) in perm.iter().enumerate() {
        let (dst, src) = (r * tr * c, j * tr * c);
        mixed[dst..dst + tr * c].copy_from_slice(&batch.targets[src..src + tr * c]);
    }
    batch.mix = Some((lam, mixed));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Generator;
    use crate::spec::Case;

    fn cnn_batch() -> HostBatch {
        Generator::new(&Case::example("cnn").unwrap()).batch(0, 4)
    }

    fn values(b: &HostBatch) -> &[f32] {
        match &b.input {
            HostInput::Real { values, .. } => values,
            HostInput::Tokens { .. } => panic!(),
        }
    }

    #[test]
    fn erasing_with_full_scale_erases_everything() {
        let mut b = cnn_batch();
        let aug = Augment::RandomErasing {
            p: 1.0,
            scale: [1.0, 1.0],
            ratio: [1.0, 1.0],
            value: 0.0,
        };
        apply(&mut b, &aug, 0, 0, 0);
        assert!(values(&b).iter().all(|&v| v == 0.0));
    }

    #[test]
    fn per_sample_standardization_of_constant_image_with_zero_eps_is_nan() {
        let mut b = cnn_batch();
        if let HostInput::Real { values, .. } = &mut b.input {
            values.fill(0.5);
        }
        apply(
            &mut b,
            &Augment::Normalize(NormalizeSpec::PerSample { eps: 0.0 }),
            0,
            0,
            0,
        );
        assert!(values(&b).iter().all(|v| v.is_nan()));
    }

    #[test]
    fn identity_affine_keeps_the_image() {
        let mut b = cnn_batch();
        let before = values(&b).to_vec();
        let aug = Augment::RandomAffine {
            degrees: 0.0,
            translate: [0.0, 0.0],
            scale: [1.0, 1.0],
            shear: 0.0,
        };
        apply(&mut b, &aug, 0, 0, 0);
        for (a, c) in before.iter().zip(values(&b)) {
            assert!((a - c).abs() < 1e-5);
        }
    }

    #[test]
    fn mixup_mixes_inputs_and_targets_with_one_lambda() {
        let mut b = cnn_batch();
        apply(&mut b, &Augment::Mixup { alpha: 0.4 }, 0, 0, 0);
        let (lam, t2) = b.mix.clone().unwrap();
        assert!((0.0..=1.0).contains(&lam));
        assert_eq!(t2.len(), b.targets.len());
    }
}
