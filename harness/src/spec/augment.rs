//! Batch augmentations (the article's augmentation traps among them).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Augment {
    /// torchvision's RandomErasing: with probability p, fill a rectangle of
    /// area fraction in `scale` and aspect ratio in `ratio` with `value`.
    /// A scale up to 1.0 can erase the whole image.
    RandomErasing {
        p: f64,
        scale: [f64; 2],
        ratio: [f64; 2],
        value: f64,
    },
    /// Brightness/contrast/saturation factors drawn from [1-x, 1+x] (floored
    /// at 0); hue shift drawn from [-hue, hue] turns (saturation and hue need
    /// 3 channels and are skipped otherwise).
    ColorJitter {
        brightness: f64,
        contrast: f64,
        saturation: f64,
        hue: f64,
    },
    /// Rotation in [-degrees, degrees], translation up to `translate` of the
    /// size, scale in `scale`, shear in [-shear, shear] degrees; bilinear
    /// sampling, zero fill.
    RandomAffine {
        degrees: f64,
        translate: [f64; 2],
        scale: [f64; 2],
        shear: f64,
    },
    /// Additive N(0, std²) noise on every input value.
    GaussianNoise { std: f64 },
    /// Mixup: x = λ x_i + (1-λ) x_j, λ ~ Beta(alpha, alpha); the loss mixes
    /// the two targets with the same λ.
    Mixup { alpha: f64 },
    /// Normalization, either with fixed per-channel statistics or per sample:
    /// (x - mean) / (std + eps). eps may be 0, which is the trap.
    Normalize(NormalizeSpec),
    /// Sequences: with probability p, set a run of up to `max_width` time steps to `value`.
    TimeMask {
        p: f64,
        max_width: usize,
        value: f64,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum NormalizeSpec {
    PerChannel { mean: Vec<f64>, std: Vec<f64> },
    PerSample { eps: f64 },
}

impl Augment {
    pub fn name(&self) -> &'static str {
        match self {
            Augment::RandomErasing { .. } => "random_erasing",
            Augment::ColorJitter { .. } => "color_jitter",
            Augment::RandomAffine { .. } => "random_affine",
            Augment::GaussianNoise { .. } => "gaussian_noise",
            Augment::Mixup { .. } => "mixup",
            Augment::Normalize(_) => "normalize",
            Augment::TimeMask { .. } => "time_mask",
        }
    }

    /// Whether the augmentation only makes sense on images.
    pub fn image_only(&self) -> bool {
        matches!(
            self,
            Augment::RandomErasing { .. }
                | Augment::ColorJitter { .. }
                | Augment::RandomAffine { .. }
        )
    }
}
