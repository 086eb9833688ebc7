//! Fuzzer bytes → inputs: a `Case` (small, so that one run stays short),
//! a loss input and an augmentation input. Every choice is a bounded draw
//! from `Unstructured`, so most byte strings decode to a valid input and a
//! libFuzzer mutation changes one field, not the whole case.

use crate::data::{HostBatch, HostInput};
use crate::spec::*;
use arbitrary::{Result, Unstructured};
use serde::{Deserialize, Serialize};

fn pick<T: Clone>(u: &mut Unstructured, items: &[T]) -> Result<T> {
    Ok(u.choose(items)?.clone())
}

fn size(u: &mut Unstructured, lo: usize, hi: usize) -> Result<usize> {
    u.int_in_range(lo..=hi)
}

/// 10^e · m for a decade e in [lo, hi] and m in {1, 2, 5}.
fn decade(u: &mut Unstructured, lo: i32, hi: i32) -> Result<f64> {
    let e = u.int_in_range(lo..=hi)?;
    Ok(pick(u, &[1.0, 2.0, 5.0])? * 10f64.powi(e))
}

fn eps(u: &mut Unstructured) -> Result<f64> {
    pick(u, &[0.0, 1e-12, 1e-8, 1e-6, 1e-3])
}

fn init(u: &mut Unstructured) -> Result<InitSpec> {
    Ok(InitSpec {
        scheme: pick(u, &[InitScheme::Kaiming, InitScheme::Xavier])?,
        gain: pick(u, &[1.0, 0.5, 2.0, 10.0])?,
    })
}

fn model(u: &mut Unstructured) -> Result<ModelSpec> {
    Ok(match u.int_in_range(0..=2)? {
        0 => {
            let input_channels = size(u, 1, 3)?;
            let mut previous = input_channels;
            let blocks = (0..size(u, 1, 2)?)
                .map(|_| {
                    let channels = size(u, 2, 4)?;
                    let residual = channels == previous && u.arbitrary()?;
                    previous = channels;
                    Ok(ConvBlockSpec {
                        channels,
                        kernel: pick(u, &[1, 3])?,
                        batch_norm_eps: pick(u, &[None, Some(1e-5), Some(0.0), Some(1e-3)])?,
                        activation: pick(
                            u,
                            &[
                                Activation::Relu,
                                Activation::Gelu,
                                Activation::Tanh,
                                Activation::Sigmoid,
                                Activation::LeakyRelu,
                            ],
                        )?,
                        residual,
                        pool: pick(u, &[Pool::Max, Pool::Avg, Pool::None])?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            ModelSpec::Cnn(CnnSpec {
                channels: input_channels,
                height: pick(u, &[4, 6, 8])?,
                width: pick(u, &[4, 6, 8])?,
                classes: size(u, 2, 4)?,
                blocks,
                init: init(u)?,
            })
        }
        1 => ModelSpec::Transformer(TransformerSpec {
            input: if u.arbitrary()? {
                TokenOrContinuous::Tokens {
                    vocab: size(u, 2, 16)?,
                }
            } else {
                TokenOrContinuous::Continuous {
                    features: size(u, 1, 4)?,
                }
            },
            seq_len: size(u, 1, 6)?,
            d_model: pick(u, &[4, 8])?,
            heads: pick(u, &[1, 2])?,
            layers: size(u, 1, 2)?,
            mlp_ratio: size(u, 1, 2)?,
            norm: pick(
                u,
                &[NormPlacement::Pre, NormPlacement::Post, NormPlacement::None],
            )?,
            norm_eps: pick(u, &[1e-5, 0.0, 1e-8, 1e-3])?,
            attention_scale: pick(u, &[AttentionScale::InvSqrtD, AttentionScale::None])?,
            causal: u.arbitrary()?,
            head: pick(u, &[HeadKind::Classify, HeadKind::PerToken])?,
            classes: size(u, 2, 4)?,
            init: init(u)?,
        }),
        _ => ModelSpec::Rnn(RnnSpec {
            cell: pick(u, &[CellKind::Rnn, CellKind::Lstm, CellKind::Gru])?,
            features: size(u, 1, 4)?,
            seq_len: size(u, 1, 6)?,
            hidden: size(u, 2, 8)?,
            layers: size(u, 1, 2)?,
            classes: size(u, 2, 4)?,
            init: init(u)?,
        }),
    })
}

/// A precision; `convolutions` leaves out bf16 compute, which candle cannot
/// run on CPU.
fn precision(u: &mut Unstructured, convolutions: bool) -> Result<Precision> {
    let halves: &[HalfType] = if convolutions {
        &[HalfType::F16]
    } else {
        &[HalfType::F16, HalfType::Bf16]
    };
    Ok(match u.int_in_range(0..=5)? {
        0 => Precision::F32,
        1 => Precision::F64,
        2 => Precision::F16,
        3 if !convolutions => Precision::Bf16,
        3 => Precision::F32,
        _ => Precision::Mixed {
            compute: pick(u, halves)?,
            loss_scaling: match u.int_in_range(0..=2)? {
                0 => LossScaling::None,
                1 => LossScaling::Static {
                    scale: decade(u, 0, 5)?,
                },
                _ => LossScaling::default(),
            },
        },
    })
}

fn fraction(u: &mut Unstructured) -> Result<f64> {
    pick(u, &[0.01, 0.1, 0.5, 1.0])
}

/// A pathology that fits the input (`features`: None for token ids) and
/// the loss (`labels`: whether it trains on class labels).
fn pathology(u: &mut Unstructured, features: Option<usize>, labels: bool) -> Result<Pathology> {
    let from_step = size(u, 0, 3)?;
    let kind = match (features, labels) {
        (Some(_), true) => u.int_in_range(0..=6)?,
        (Some(_), false) => u.int_in_range(0..=5)?,
        (None, _) => 6,
    };
    Ok(match kind {
        0 => Pathology::Nan {
            fraction: fraction(u)?,
            from_step,
        },
        1 => Pathology::Inf {
            fraction: fraction(u)?,
            from_step,
        },
        2 => Pathology::Extreme {
            fraction: fraction(u)?,
            magnitude: decade(u, 3, 29)?,
            from_step,
        },
        3 => Pathology::ConstantFeature {
            feature: size(u, 0, features.unwrap_or(1) - 1)?,
            value: pick(u, &[0.0, 1.0, 1e6])?,
            from_step,
        },
        4 => Pathology::AllZero {
            fraction: fraction(u)?,
            from_step,
        },
        5 => Pathology::Subnormal {
            fraction: fraction(u)?,
            from_step,
        },
        _ => Pathology::LabelOutOfRange {
            fraction: fraction(u)?,
            offset: size(u, 1, 3)?,
            from_step,
        },
    })
}

/// An augmentation for this input, with parameters inside the ranges
/// `validate` accepts.
pub fn augment(u: &mut Unstructured, input: &InputSpec) -> Result<Augment> {
    let channels = match *input {
        InputSpec::Image { channels, .. } => channels,
        InputSpec::Sequence { features, .. } => features,
        _ => 1,
    };
    // Images: everything but time masks; sequences: no image-only kinds.
    let kind = match input {
        InputSpec::Image { .. } => u.int_in_range(0..=6)?,
        _ => *u.choose(&[3, 4, 5, 6, 7])?,
    };
    let unit =
        |u: &mut Unstructured| -> Result<f64> { Ok(u.int_in_range(0..=100u32)? as f64 / 100.0) };
    let interval = |u: &mut Unstructured, lo: f64, hi: f64| -> Result<[f64; 2]> {
        let a = lo + (hi - lo) * unit(u)?;
        let b = lo + (hi - lo) * unit(u)?;
        Ok([a.min(b), a.max(b)])
    };
    Ok(match kind {
        0 => Augment::RandomErasing {
            p: unit(u)?,
            scale: interval(u, 0.0, 1.0)?,
            ratio: interval(u, 1e-3, 1e3)?,
            value: pick(u, &[0.0, 1.0, -1.0, 1e3])?,
        },
        1 => Augment::ColorJitter {
            brightness: 100.0 * unit(u)?,
            contrast: 100.0 * unit(u)?,
            saturation: 100.0 * unit(u)?,
            hue: 0.5 * unit(u)?,
        },
        2 => Augment::RandomAffine {
            degrees: 180.0 * unit(u)?,
            translate: [unit(u)?, unit(u)?],
            scale: interval(u, 1e-3, 100.0)?,
            shear: 89.0 * unit(u)?,
        },
        3 => Augment::GaussianNoise {
            std: pick(u, &[0.0, 0.1, 1.0, 1e3, 1e30])?,
        },
        4 => Augment::Mixup {
            alpha: decade(u, -3, 2)?,
        },
        5 => Augment::Normalize(NormalizeSpec::PerSample { eps: eps(u)? }),
        6 => Augment::Normalize(NormalizeSpec::PerChannel {
            mean: (0..channels)
                .map(|_| pick(u, &[0.0, 0.5, -1.0, 1e3]))
                .collect::<Result<_>>()?,
            std: (0..channels)
                .map(|_| pick(u, &[1.0, 0.5, 1e-3, 0.0, 1e3]))
                .collect::<Result<_>>()?,
        }),
        _ => Augment::TimeMask {
            p: unit(u)?,
            max_width: size(u, 1, 8)?,
            value: pick(u, &[0.0, 1.0, 1e3])?,
        },
    })
}

/// A loss with its eps/clamp knobs.
pub fn loss(u: &mut Unstructured) -> Result<LossSpec> {
    Ok(match u.int_in_range(0..=9)? {
        0 => LossSpec::CrossEntropy {
            label_smoothing: pick(u, &[0.0, 0.1, 0.5])?,
        },
        1 => LossSpec::NaiveCrossEntropy { eps: eps(u)? },
        2 => LossSpec::Nll,
        3 => LossSpec::Mse {
            root: u.arbitrary()?,
            eps: eps(u)?,
        },
        4 => LossSpec::Huber {
            delta: pick(u, &[1.0, 0.1, 10.0])?,
        },
        5 => LossSpec::Bce { eps: eps(u)? },
        6 => LossSpec::BceWithLogits,
        7 => LossSpec::KlDiv { eps: eps(u)? },
        8 => LossSpec::PoissonNll {
            log_input: u.arbitrary()?,
            eps: eps(u)?,
        },
        _ => LossSpec::LogOneMinus { eps: eps(u)? },
    })
}

fn optimizer(u: &mut Unstructured) -> Result<OptimizerSpec> {
    let lr = decade(u, -5, 1)?;
    let weight_decay = pick(u, &[0.0, 0.01])?;
    let beta1 = pick(u, &[0.9, 0.0, 0.99])?;
    let beta2 = pick(u, &[0.999, 0.9, 0.99])?;
    Ok(match u.int_in_range(0..=3)? {
        0 => {
            let momentum = pick(u, &[0.0, 0.9])?;
            OptimizerSpec::Sgd {
                lr,
                momentum,
                nesterov: momentum > 0.0 && u.arbitrary()?,
                weight_decay,
            }
        }
        1 => OptimizerSpec::Adam {
            lr,
            beta1,
            beta2,
            eps: eps(u)?,
            weight_decay,
        },
        2 => OptimizerSpec::Adamw {
            lr,
            beta1,
            beta2,
            eps: eps(u)?,
            weight_decay,
        },
        _ => OptimizerSpec::Rmsprop {
            lr,
            alpha: pick(u, &[0.99, 0.9])?,
            eps: eps(u)?,
            momentum: pick(u, &[0.0, 0.9])?,
            weight_decay,
        },
    })
}

/// A case of at most a few thousand parameters, 6 steps and batch 8.
pub fn case(u: &mut Unstructured) -> Result<Case> {
    let model = model(u)?;
    let input = model.input();
    let features = match input {
        InputSpec::Image { channels, .. } => Some(channels),
        InputSpec::Sequence { features, .. } => Some(features),
        InputSpec::Vector { features } => Some(features),
        InputSpec::Tokens { .. } => None,
    };
    let augment = match features {
        Some(_) => (0..size(u, 0, 2)?)
            .map(|_| augment(u, &input))
            .collect::<Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    let loss = loss(u)?;
    let labels = loss.target_kind() == TargetKind::Labels;
    let pathologies = match (features, labels) {
        (None, false) => Vec::new(),
        _ => (0..size(u, 0, 2)?)
            .map(|_| pathology(u, features, labels))
            .collect::<Result<_>>()?,
    };
    let convolutions = matches!(model, ModelSpec::Cnn(_));
    Ok(Case {
        format: FORMAT_VERSION,
        seed: u.int_in_range(0..=1023)?,
        device: DeviceSpec::Cpu,
        precision: precision(u, convolutions)?,
        steps: size(u, 1, 6)?,
        batch_size: size(u, 1, 8)?,
        model,
        data: DataSpec {
            scale: decade(u, -3, 6)?,
            offset: pick(u, &[0.0, 1.0, 100.0])?,
            distribution: pick(
                u,
                &[
                    Distribution::Normal,
                    Distribution::Uniform,
                    Distribution::HeavyTailed,
                ],
            )?,
            noise: pick(u, &[0.5, 0.0, 2.0])?,
            pathologies,
            full_batch: u.arbitrary()?,
            source: crate::spec::SourceSpec::Synthetic,
        },
        augment,
        loss,
        optimizer: optimizer(u)?,
        schedule: match u.int_in_range(0..=3)? {
            0 => ScheduleSpec::Constant,
            1 => ScheduleSpec::Warmup {
                warmup_steps: size(u, 1, 4)?,
            },
            2 => ScheduleSpec::Cosine {
                warmup_steps: size(u, 0, 2)?,
                min_factor: pick(u, &[0.0, 0.1])?,
            },
            _ => ScheduleSpec::Step {
                step_size: size(u, 1, 3)?,
                gamma: pick(u, &[0.1, 0.5, 2.0])?,
            },
        },
        clip: match u.int_in_range(0..=2)? {
            0 => ClipSpec::None,
            1 => ClipSpec::Norm {
                max_norm: decade(u, -2, 2)?,
            },
            _ => ClipSpec::Value {
                value: decade(u, -2, 2)?,
            },
        },
        divergence_factor: 4.0,
    })
}

/// A finite f32 of any magnitude up to `max_abs` (a decade, a mantissa, a sign).
fn finite_value(u: &mut Unstructured, max_abs: f64) -> Result<f32> {
    let top = max_abs.log10().floor() as i32;
    let e = u.int_in_range(-8..=top.max(-8))?;
    let m = 1.0 + u.int_in_range(0..=899u32)? as f64 / 100.0;
    let sign = if u.arbitrary()? { -1.0 } else { 1.0 };
    Ok((sign * (m * 10f64.powi(e)).min(max_abs)) as f32)
}

/// Input of the `losses` target: a loss and a (rows × classes) batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossInput {
    /// The loss.
    pub loss: LossSpec,
    /// Rows.
    pub rows: usize,
    /// Classes.
    pub classes: usize,
    /// The logits, rows × classes.
    pub logits: Vec<f32>,
    /// One label per row.
    pub labels: Vec<i64>,
}

/// A loss input with logits of any finite magnitude up to `max_abs(loss)`.
pub fn loss_input(u: &mut Unstructured, max_abs: impl Fn(&LossSpec) -> f64) -> Result<LossInput> {
    let loss = loss(u)?;
    let rows = size(u, 1, 4)?;
    let classes = size(u, 2, 6)?;
    let bound = max_abs(&loss);
    let logits = (0..rows * classes)
        .map(|_| {
            if u.ratio(1, 4)? {
                Ok(0.0)
            } else {
                finite_value(u, bound)
            }
        })
        .collect::<Result<_>>()?;
    let labels = (0..rows)
        .map(|_| u.int_in_range(0..=classes as i64 - 1))
        .collect::<Result<_>>()?;
    Ok(LossInput {
        loss,
        rows,
        classes,
        logits,
        labels,
    })
}

/// Input of the `augmentations` target: an augmentation and a finite batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AugmentInput {
    /// The augmentation.
    pub augment: Augment,
    /// (batch, channels, height, width), or (batch, seq_len, features) for time masks.
    pub dims: Vec<usize>,
    /// The batch's values.
    pub values: Vec<f32>,
    /// The augmentation's seed.
    pub seed: u64,
    /// The step it runs at.
    pub step: usize,
}

impl AugmentInput {
    /// The batch it augments.
    pub fn batch(&self) -> HostBatch {
        let rows = self.dims[0];
        let classes = 2;
        HostBatch {
            input: HostInput::Real {
                values: self.values.clone(),
                dims: self.dims.clone(),
            },
            labels: (0..rows as i64).map(|r| r % 2).collect(),
            targets: (0..rows * classes)
                .map(|i| {
                    if i % classes == (i / classes) % 2 {
                        1.0
                    } else {
                        0.0
                    }
                })
                .collect(),
            classes,
            target_kind: TargetKind::Labels,
            mix: None,
            samples: Vec::new(),
        }
    }
}

/// An augmentation input with pixel values up to `max_abs`.
pub fn augment_input(u: &mut Unstructured, max_abs: f64) -> Result<AugmentInput> {
    let rows = size(u, 1, 3)?;
    let channels = size(u, 1, 3)?;
    let input = if u.arbitrary()? {
        InputSpec::Image {
            channels,
            height: size(u, 1, 6)?,
            width: size(u, 1, 6)?,
        }
    } else {
        InputSpec::Sequence {
            seq_len: size(u, 1, 8)?,
            features: channels,
        }
    };
    let augment = augment(u, &input)?;
    let mut dims = vec![rows];
    dims.extend(input.dims());
    let n: usize = dims.iter().product();
    // Constant images (all one value) are the classic trap for
    // normalization, so a quarter of the batches are constant.
    let constant = u.ratio(1, 4)?;
    let first = finite_value(u, max_abs)?;
    let values = (0..n)
        .map(|_| {
            if constant {
                Ok(first)
            } else {
                finite_value(u, max_abs)
            }
        })
        .collect::<Result<_>>()?;
    Ok(AugmentInput {
        augment,
        dims,
        values,
        seed: u.int_in_range(0..=1023)?,
        step: size(u, 0, 3)?,
    })
}
