//! Batch augmentations (the article's augmentation traps among them).

use serde::{Deserialize, Serialize};

/// A batch augmentation, applied on the host after the data's pathologies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Augment {
    /// torchvision's RandomErasing: with probability p, fill a rectangle of
    /// area fraction in `scale` and aspect ratio in `ratio` with `value`.
    /// A scale up to 1.0 can erase the whole image.
    RandomErasing {
        /// The probability of erasing a sample.
        p: f64,
        /// The erased area's fraction of the image, drawn from [min, max].
        scale: [f64; 2],
        /// The rectangle's aspect ratio, drawn from [min, max].
        ratio: [f64; 2],
        /// The fill value.
        value: f64,
    },
    /// Brightness/contrast/saturation factors drawn from [1-x, 1+x] (floored
    /// at 0); hue shift drawn from [-hue, hue] turns (saturation and hue need
    /// 3 channels and are skipped otherwise).
    ColorJitter {
        /// The brightness factor's spread.
        brightness: f64,
        /// The contrast factor's spread.
        contrast: f64,
        /// The saturation factor's spread.
        saturation: f64,
        /// The hue shift's bound, in turns.
        hue: f64,
    },
    /// Rotation in [-degrees, degrees], translation up to `translate` of the
    /// size, scale in `scale`, shear in [-shear, shear] degrees; bilinear
    /// sampling, zero fill.
    RandomAffine {
        /// The rotation's bound, in degrees.
        degrees: f64,
        /// The largest translation, as fractions of the width and height.
        translate: [f64; 2],
        /// The scale factor, drawn from [min, max].
        scale: [f64; 2],
        /// The shear's bound, in degrees.
        shear: f64,
    },
    /// Additive N(0, std²) noise on every input value.
    GaussianNoise {
        /// The noise's standard deviation.
        std: f64,
    },
    /// Mixup: x = λ x_i + (1-λ) x_j, λ ~ Beta(alpha, alpha); the loss mixes
    /// the two targets with the same λ.
    Mixup {
        /// The Beta distribution's parameter.
        alpha: f64,
    },
    /// Normalization, either with fixed per-channel statistics or per sample:
    /// (x - mean) / (std + eps). eps may be 0, which is the trap.
    Normalize(NormalizeSpec),
    /// Sequences: with probability p, set a run of up to `max_width` time steps to `value`.
    TimeMask {
        /// The probability of masking a sequence.
        p: f64,
        /// The longest masked run, in time steps.
        max_width: usize,
        /// The fill value.
        value: f64,
    },
}

/// How `Normalize` computes its statistics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum NormalizeSpec {
    /// Fixed statistics per channel (torchvision's `Normalize`).
    PerChannel {
        /// One mean per channel.
        mean: Vec<f64>,
        /// One standard deviation per channel.
        std: Vec<f64>,
    },
    /// Each sample's own mean and standard deviation.
    PerSample {
        /// Added to the standard deviation (0 is the trap).
        eps: f64,
    },
}

impl Augment {
    /// The augmentation's name as stages and reports give it.
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
