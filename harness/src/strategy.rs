//! proptest strategies over the whole case space. The property tests and
//! the campaign draw from the same strategies; [`generate`] turns a seed into
//! a case deterministically, without a test runner around it.
//!
//! Sizes are kept small by default (a run is a few dozen milliseconds):
//! instability in these models comes from the knobs, not from scale.
//! [`ModelScale::Large`] scales each drawn model up to the sizes users
//! train, for a device that small cases cannot keep busy.

use crate::spec::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde::{Deserialize, Serialize};

/// Restrictions on the generated cases.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StrategyOptions {
    /// Families to draw from (`cnn`, `transformer`, `rnn`).
    pub families: Vec<String>,
    /// No injected data pathologies.
    pub clean_data: bool,
    /// Only cases inside the documented safe envelope (see [`safe_envelope`]).
    pub safe_envelope: bool,
    /// The most training steps a case may draw.
    pub max_steps: usize,
    /// Train every case on this dataset: the model is fitted to its samples
    /// and classes, the data is fixed, every other knob is fuzzed.
    pub dataset: Option<DatasetFit>,
    /// Draw around this case instead of the built-in families: its model
    /// (with its declared knobs drawn within their ranges) and its data
    /// source (pathologies and, for synthetic data, the scale drawn on top)
    /// stay; every other knob is drawn. A campaign over a user's own model.
    pub base: Option<Case>,
    /// The scale of the built-in families' models and of every batch.
    pub scale: ModelScale,
}

/// The scale of the models a campaign draws.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelScale {
    /// Widths of 1 to 32, sequences of 2 to 12, images of 4×4 to 12×12,
    /// batches of 2 to 16: a run takes milliseconds.
    #[default]
    Small,
    /// The small draws scaled up ([`scaled_up`]; a draw that can be built
    /// only large, a CNN pooling a small image to nothing, is kept where a
    /// small campaign draws again): transformer-style widths
    /// ×8 (16 to 256), every other width, sequence, image side and
    /// vocabulary ×4, batches ×4 (8 to 64): the widths, lengths and
    /// batches of the families' `--size large` cases
    /// (`Case::example_sized`) and beyond. A user's own model keeps its
    /// sizes; only its batch is scaled.
    Large,
}

impl ModelScale {
    /// Both scales, smallest first.
    pub const ALL: [ModelScale; 2] = [ModelScale::Small, ModelScale::Large];

    /// The scale's name (`small`, `large`).
    pub fn name(self) -> &'static str {
        match self {
            ModelScale::Small => "small",
            ModelScale::Large => "large",
        }
    }

    /// Whether this is the default scale (left out of journals).
    pub fn is_small(&self) -> bool {
        *self == ModelScale::Small
    }
}

impl std::str::FromStr for ModelScale {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        ModelScale::ALL
            .into_iter()
            .find(|z| z.name() == s)
            .ok_or_else(|| format!("unknown size `{s}`: expected small or large"))
    }
}

/// How much [`ModelScale::Large`] multiplies a drawn size by.
const LARGE: usize = 4;

/// A drawn built-in model at [`ModelScale::Large`]: the transformer-style
/// models' head widths ×8 (their heads as drawn), every other width,
/// sequence, image side, input width and vocabulary ×4. Every other knob
/// (activations, norms, epsilons, initialisation, masks) stays as drawn, so
/// a large campaign fuzzes the same space at the scale users train.
pub fn scaled_up(model: &mut ModelSpec) {
    match model {
        ModelSpec::Cnn(m) => {
            (m.height, m.width) = (m.height * LARGE, m.width * LARGE);
            m.blocks.iter_mut().for_each(|b| b.channels *= LARGE);
            // A first block that kept the image's channels no longer does.
            m.fix_residuals();
        }
        ModelSpec::Transformer(t) => {
            t.d_model *= 2 * LARGE;
            t.seq_len *= LARGE;
            t.input = match t.input {
                TokenOrContinuous::Tokens { vocab } => TokenOrContinuous::Tokens {
                    vocab: vocab * LARGE,
                },
                TokenOrContinuous::Continuous { features } => TokenOrContinuous::Continuous {
                    features: features * LARGE,
                },
            };
        }
        ModelSpec::Rnn(r) => {
            (r.features, r.hidden) = (r.features * LARGE, r.hidden * LARGE);
            r.seq_len *= LARGE;
        }
        ModelSpec::Decoder(d) => {
            d.d_model *= 2 * LARGE;
            (d.seq_len, d.vocab) = (d.seq_len * LARGE, d.vocab * LARGE);
        }
        ModelSpec::Encoder(e) => {
            e.d_model *= 2 * LARGE;
            (e.seq_len, e.vocab) = (e.seq_len * LARGE, e.vocab * LARGE);
            e.min_length = (e.min_length * LARGE).min(e.seq_len);
        }
        // A user's model has the sizes its author gave it.
        ModelSpec::Custom(_) => {}
    }
}

impl Default for StrategyOptions {
    fn default() -> Self {
        StrategyOptions {
            families: FAMILIES.iter().map(|f| f.to_string()).collect(),
            clean_data: false,
            safe_envelope: false,
            max_steps: 30,
            dataset: None,
            base: None,
            scale: ModelScale::Small,
        }
    }
}

/// What generated cases need to know of a dataset to fit a model to it.
#[derive(Clone, Debug, PartialEq)]
pub struct DatasetFit {
    /// The file, pinned to its hash.
    pub source: FileSource,
    /// One sample's dims.
    pub dims: Vec<usize>,
    /// Integer inputs: the vocabulary a token model needs (largest id + 1).
    pub vocab: Option<usize>,
    /// Largest label + 1 (at least 2).
    pub classes: usize,
    /// One label per position (a per-token objective).
    pub per_token: bool,
}

impl DatasetFit {
    /// Reads the dataset once (at most `max_bytes` in memory).
    pub fn of(source: &FileSource, max_bytes: usize) -> crate::Result<Self> {
        let data = crate::data::files::load(source, max_bytes)?;
        let mut source = source.clone();
        source.sha256 = data.sha256.clone();
        let max_label = data.labels.iter().copied().max().unwrap_or(0).max(1);
        let vocab = data
            .shape
            .integer
            .then(|| data.values.iter().fold(0f32, |m, &v| m.max(v)) as usize + 1);
        Ok(DatasetFit {
            source,
            dims: data.shape.dims.clone(),
            vocab,
            classes: (max_label as usize + 1).max(2),
            per_token: data.shape.labels > 1,
        })
    }

    /// (seq_len, features) of a sequence model reading the samples.
    fn sequence(&self) -> (usize, usize) {
        let n: usize = self.dims.iter().product();
        match self.dims.as_slice() {
            [.., last] if self.dims.len() > 1 => (n / last, *last),
            _ => (n, 1),
        }
    }

    /// Whether a family can read the samples.
    pub fn fits(&self, family: &str) -> bool {
        match family {
            "cnn" => !self.per_token && matches!(self.dims.len(), 2 | 3),
            "rnn" => !self.per_token,
            "decoder" | "encoder" => {
                self.vocab.is_some() && self.dims.len() == 1 && !self.per_token
            }
            _ => true,
        }
    }
}

impl StrategyOptions {
    /// The data every case trains on, in words (`path sha256`, or a user
    /// dataset's name), when the campaign fixes it.
    pub fn data_name(&self) -> Option<String> {
        if let Some(fit) = &self.dataset {
            return Some(format!(
                "{} {}",
                fit.source.path.display(),
                fit.source.sha256.as_deref().unwrap_or("")
            ));
        }
        match &self.base.as_ref()?.data.source {
            SourceSpec::File(f) => Some(format!(
                "{} {}",
                f.path.display(),
                f.sha256.as_deref().unwrap_or("")
            )),
            SourceSpec::User { name, .. } => Some(format!("user dataset `{name}`")),
            // The model's case draws synthetic data at its scale.
            SourceSpec::Synthetic => Some(format!(
                "synthetic, as `{}`'s case draws it",
                self.base.as_ref()?.family()
            )),
        }
    }

    /// Checks the options before anything is drawn: known, non-empty
    /// families, and room for the 3 steps a generated run takes at least.
    pub fn validate(&self) -> crate::Result<()> {
        if self.families.is_empty() && self.base.is_none() {
            return Err(crate::Error::option("families", "name at least one family"));
        }
        if let Some(f) = self
            .families
            .iter()
            .filter(|_| self.base.is_none())
            .find(|f| !FAMILIES.contains(&f.as_str()))
        {
            return Err(crate::Error::option(
                "families",
                format!("no strategy draws `{f}`: expected one of {FAMILIES:?}"),
            ));
        }
        if let Some(fit) = &self.dataset {
            if let Some(f) = self.families.iter().find(|f| !fit.fits(f)) {
                return Err(crate::Error::option(
                    "families",
                    format!(
                        "`{f}` cannot read samples of shape {:?}{}",
                        fit.dims,
                        if fit.per_token {
                            " with per-position labels"
                        } else {
                            ""
                        }
                    ),
                ));
            }
        }
        if self.max_steps < 3 {
            return Err(crate::Error::option(
                "max_steps",
                format!(
                    "generated runs take at least 3 steps, got {}",
                    self.max_steps
                ),
            ));
        }
        Ok(())
    }
}

/// 10^x for x uniform in [lo, hi]: log-scale draws for learning rates and scales.
fn log_uniform(lo: f64, hi: f64) -> impl Strategy<Value = f64> + Clone {
    (lo..hi).prop_map(|e: f64| 10f64.powf(e))
}

fn activation() -> impl Strategy<Value = Activation> {
    prop_oneof![
        3 => Just(Activation::Relu),
        1 => Just(Activation::Gelu),
        1 => Just(Activation::Tanh),
        1 => Just(Activation::Sigmoid),
        1 => Just(Activation::LeakyRelu),
    ]
}

fn init() -> impl Strategy<Value = InitSpec> {
    (
        prop_oneof![Just(InitScheme::Kaiming), Just(InitScheme::Xavier)],
        prop_oneof![3 => Just(1.0), 1 => log_uniform(-0.6, 1.2)],
    )
        .prop_map(|(scheme, gain)| InitSpec { scheme, gain })
}

fn norm_eps() -> impl Strategy<Value = f64> {
    prop_oneof![3 => Just(1e-5), 1 => Just(0.0), 1 => Just(1e-8), 1 => Just(1e-3)]
}

fn cnn() -> impl Strategy<Value = ModelSpec> {
    let block = (
        1usize..=8,
        prop_oneof![Just(1usize), Just(3)],
        proptest::option::weighted(0.5, norm_eps()),
        activation(),
        any::<bool>(),
        prop_oneof![Just(Pool::Max), Just(Pool::Avg), Just(Pool::None)],
    );
    (
        1usize..=3,
        4usize..=12,
        2usize..=5,
        proptest::collection::vec(block, 1..=3),
        init(),
    )
        .prop_map(|(channels, size, classes, blocks, init)| {
            let mut ch = channels;
            let blocks = blocks
                .into_iter()
                .map(|(c, kernel, bn, activation, residual, pool)| {
                    // A residual block keeps the channel count.
                    let out = if residual { ch } else { c };
                    ch = out;
                    ConvBlockSpec {
                        channels: out,
                        kernel,
                        batch_norm_eps: bn,
                        activation,
                        residual,
                        pool,
                    }
                })
                .collect();
            ModelSpec::Cnn(CnnSpec {
                channels,
                height: size,
                width: size,
                classes,
                blocks,
                init,
            })
        })
}

fn transformer() -> impl Strategy<Value = ModelSpec> {
    (
        prop_oneof![
            (4usize..=16).prop_map(|vocab| TokenOrContinuous::Tokens { vocab }),
            (1usize..=4).prop_map(|features| TokenOrContinuous::Continuous { features }),
        ],
        2usize..=8,
        prop_oneof![Just(1usize), Just(2)],
        prop_oneof![Just(2usize), Just(4), Just(8)],
        1usize..=2,
        1usize..=2,
        prop_oneof![
            Just(NormPlacement::Pre),
            Just(NormPlacement::Post),
            Just(NormPlacement::None)
        ],
        norm_eps(),
        prop_oneof![3 => Just(AttentionScale::InvSqrtD), 1 => Just(AttentionScale::None)],
        any::<bool>(),
        prop_oneof![Just(HeadKind::Classify), Just(HeadKind::PerToken)],
        (2usize..=4, init()),
    )
        .prop_map(
            |(
                input,
                seq_len,
                heads,
                head_dim,
                layers,
                mlp_ratio,
                norm,
                norm_eps,
                attention_scale,
                causal,
                head,
                (classes, init),
            )| {
                ModelSpec::Transformer(TransformerSpec {
                    input,
                    seq_len,
                    d_model: heads * head_dim,
                    heads,
                    layers,
                    mlp_ratio,
                    norm,
                    norm_eps,
                    attention_scale,
                    causal,
                    head,
                    classes,
                    init,
                })
            },
        )
}

fn rnn() -> impl Strategy<Value = ModelSpec> {
    (
        prop_oneof![
            Just(CellKind::Rnn),
            Just(CellKind::Lstm),
            Just(CellKind::Gru)
        ],
        1usize..=4,
        2usize..=12,
        2usize..=16,
        1usize..=2,
        2usize..=4,
        init(),
    )
        .prop_map(|(cell, features, seq_len, hidden, layers, classes, init)| {
            ModelSpec::Rnn(RnnSpec {
                cell,
                features,
                seq_len,
                hidden,
                layers,
                classes,
                init,
            })
        })
}

fn decoder() -> impl Strategy<Value = ModelSpec> {
    (
        4usize..=16,
        2usize..=8,
        prop_oneof![
            Just((1usize, 1usize)),
            Just((2, 1)),
            Just((2, 2)),
            Just((4, 2))
        ],
        prop_oneof![Just(2usize), Just(4), Just(8)],
        1usize..=2,
        1usize..=2,
        norm_eps(),
        prop_oneof![3 => Just(AttentionScale::InvSqrtD), 1 => Just(AttentionScale::None)],
        init(),
    )
        .prop_map(
            |(
                vocab,
                seq_len,
                (heads, kv_heads),
                head_dim,
                layers,
                mlp_ratio,
                rms_eps,
                attention_scale,
                init,
            )| {
                ModelSpec::Decoder(DecoderSpec {
                    vocab,
                    seq_len,
                    d_model: heads * head_dim,
                    heads,
                    kv_heads,
                    layers,
                    mlp_ratio,
                    rms_eps,
                    rope_theta: 10_000.0,
                    attention_scale,
                    init,
                })
            },
        )
}

fn encoder() -> impl Strategy<Value = ModelSpec> {
    (
        4usize..=16,
        2usize..=8,
        prop_oneof![Just(1usize), Just(2)],
        prop_oneof![Just(2usize), Just(4), Just(8)],
        1usize..=2,
        1usize..=2,
        norm_eps(),
        prop_oneof![3 => Just(AttentionScale::InvSqrtD), 1 => Just(AttentionScale::None)],
        prop_oneof![
            2 => Just(MaskKind::default()),
            1 => Just(MaskKind::Additive { value: f64::from(f32::MIN) }),
            1 => Just(MaskKind::NegInf)
        ],
        0usize..=2,
        (2usize..=4, init()),
    )
        .prop_map(
            |(
                vocab,
                seq_len,
                heads,
                head_dim,
                layers,
                mlp_ratio,
                norm_eps,
                attention_scale,
                mask,
                min_length,
                (classes, init),
            )| {
                ModelSpec::Encoder(EncoderSpec {
                    vocab,
                    seq_len,
                    d_model: heads * head_dim,
                    heads,
                    layers,
                    mlp_ratio,
                    norm_eps,
                    attention_scale,
                    mask,
                    min_length: min_length.min(seq_len),
                    classes,
                    init,
                })
            },
        )
}

/// Models of a built-in family; any other name is a caller's mistake
/// ([`StrategyOptions::validate`] catches it first) and panics.
pub fn model(family: &str) -> BoxedStrategy<ModelSpec> {
    match family {
        "cnn" => cnn().boxed(),
        "transformer" => transformer().boxed(),
        "rnn" => rnn().boxed(),
        "decoder" => decoder().boxed(),
        "encoder" => encoder().boxed(),
        other => panic!("no strategy draws the family `{other}` (expected one of {FAMILIES:?})"),
    }
}

fn pathology() -> impl Strategy<Value = Pathology> {
    let fraction = log_uniform(-3.0, -0.5);
    let from = 0usize..5;
    prop_oneof![
        (fraction.clone(), from.clone()).prop_map(|(fraction, from_step)| Pathology::Nan {
            fraction,
            from_step
        }),
        (fraction.clone(), from.clone()).prop_map(|(fraction, from_step)| Pathology::Inf {
            fraction,
            from_step
        }),
        (fraction.clone(), log_uniform(3.0, 30.0), from.clone()).prop_map(
            |(fraction, magnitude, from_step)| Pathology::Extreme {
                fraction,
                magnitude,
                from_step
            }
        ),
        (prop_oneof![Just(0.0), Just(1.0)], from.clone()).prop_map(|(value, from_step)| {
            Pathology::ConstantFeature {
                feature: 0,
                value,
                from_step,
            }
        }),
        (fraction.clone(), from.clone()).prop_map(|(fraction, from_step)| Pathology::AllZero {
            fraction,
            from_step
        }),
        (fraction.clone(), from.clone()).prop_map(|(fraction, from_step)| Pathology::Subnormal {
            fraction,
            from_step
        }),
        (fraction, from).prop_map(|(fraction, from_step)| Pathology::LabelOutOfRange {
            fraction,
            offset: 1,
            from_step
        }),
    ]
}

fn data(clean: bool) -> impl Strategy<Value = DataSpec> {
    let pathologies = if clean {
        Just(Vec::new()).boxed()
    } else {
        prop_oneof![3 => Just(Vec::new()), 1 => proptest::collection::vec(pathology(), 1..=2)]
            .boxed()
    };
    (
        prop_oneof![3 => Just(1.0), 1 => log_uniform(-1.0, 4.0)],
        prop_oneof![3 => Just(0.0), 1 => -10.0..10.0f64],
        prop_oneof![
            Just(Distribution::Normal),
            Just(Distribution::Uniform),
            Just(Distribution::HeavyTailed)
        ],
        prop_oneof![Just(0.5), Just(0.0), Just(2.0)],
        pathologies,
    )
        .prop_map(
            |(scale, offset, distribution, noise, pathologies)| DataSpec {
                scale,
                offset,
                distribution,
                noise,
                pathologies,
                full_batch: false,
                source: SourceSpec::Synthetic,
            },
        )
}

fn augmentation() -> impl Strategy<Value = Augment> {
    prop_oneof![
        (
            0.0..=1.0f64,
            0.02..0.5f64,
            prop_oneof![Just(0.0), Just(1.0)]
        )
            .prop_map(|(p, hi, value)| {
                Augment::RandomErasing {
                    p,
                    scale: [0.02, hi.max(0.02)],
                    ratio: [0.3, 3.3],
                    value,
                }
            }),
        Just(Augment::RandomErasing {
            p: 1.0,
            scale: [1.0, 1.0],
            ratio: [1.0, 1.0],
            value: 0.0
        }),
        (0.0..1.0f64, 0.0..1.0f64, 0.0..1.0f64, 0.0..0.5f64).prop_map(
            |(brightness, contrast, saturation, hue)| {
                Augment::ColorJitter {
                    brightness,
                    contrast,
                    saturation,
                    hue,
                }
            }
        ),
        (0.0..45.0f64, 0.0..0.3f64, 0.0..45.0f64).prop_map(|(degrees, t, shear)| {
            Augment::RandomAffine {
                degrees,
                translate: [t, t],
                scale: [0.8, 1.2],
                shear,
            }
        }),
        log_uniform(-2.0, 1.0).prop_map(|std| Augment::GaussianNoise { std }),
        (0.1..1.0f64).prop_map(|alpha| Augment::Mixup { alpha }),
        prop_oneof![Just(0.0), Just(1e-5)]
            .prop_map(|eps| Augment::Normalize(NormalizeSpec::PerSample { eps })),
        (0.0..=1.0f64, 1usize..4).prop_map(|(p, max_width)| Augment::TimeMask {
            p,
            max_width,
            value: 0.0
        }),
    ]
}

fn loss() -> impl Strategy<Value = LossSpec> {
    let eps = prop_oneof![Just(0.0), Just(1e-12), Just(1e-7)];
    prop_oneof![
        4 => prop_oneof![Just(0.0), Just(0.1)].prop_map(|label_smoothing| LossSpec::CrossEntropy { label_smoothing }),
        1 => eps.clone().prop_map(|eps| LossSpec::NaiveCrossEntropy { eps }),
        1 => Just(LossSpec::Nll),
        1 => (any::<bool>(), eps.clone()).prop_map(|(root, eps)| LossSpec::Mse { root, eps }),
        1 => Just(LossSpec::Huber { delta: 1.0 }),
        1 => eps.clone().prop_map(|eps| LossSpec::Bce { eps }),
        1 => Just(LossSpec::BceWithLogits),
        1 => eps.clone().prop_map(|eps| LossSpec::KlDiv { eps }),
        1 => (any::<bool>(), eps.clone()).prop_map(|(log_input, eps)| LossSpec::PoissonNll { log_input, eps }),
        1 => eps.prop_map(|eps| LossSpec::LogOneMinus { eps }),
    ]
}

fn optimizer() -> impl Strategy<Value = OptimizerSpec> {
    let lr = log_uniform(-5.0, 1.0);
    let eps = prop_oneof![3 => Just(1e-8), 1 => Just(0.0), 1 => Just(1e-12), 1 => Just(1e-6)];
    let wd = prop_oneof![3 => Just(0.0), 1 => Just(1e-4), 1 => Just(0.1)];
    prop_oneof![
        (
            lr.clone(),
            prop_oneof![Just(0.0), Just(0.9)],
            any::<bool>(),
            wd.clone()
        )
            .prop_map(
                |(lr, momentum, nesterov, weight_decay)| OptimizerSpec::Sgd {
                    lr,
                    momentum,
                    nesterov: nesterov && momentum > 0.0,
                    weight_decay,
                }
            ),
        (lr.clone(), eps.clone(), wd.clone()).prop_map(|(lr, eps, weight_decay)| {
            OptimizerSpec::Adam {
                lr,
                beta1: 0.9,
                beta2: 0.999,
                eps,
                weight_decay,
            }
        }),
        (lr.clone(), eps.clone(), wd.clone()).prop_map(|(lr, eps, weight_decay)| {
            OptimizerSpec::Adamw {
                lr,
                beta1: 0.9,
                beta2: 0.999,
                eps,
                weight_decay,
            }
        }),
        (lr, eps, wd).prop_map(|(lr, eps, weight_decay)| OptimizerSpec::Rmsprop {
            lr,
            alpha: 0.99,
            eps,
            momentum: 0.0,
            weight_decay,
        }),
    ]
}

fn schedule() -> impl Strategy<Value = ScheduleSpec> {
    prop_oneof![
        3 => Just(ScheduleSpec::Constant),
        1 => (1usize..10).prop_map(|warmup_steps| ScheduleSpec::Warmup { warmup_steps }),
        1 => (0usize..5).prop_map(|warmup_steps| ScheduleSpec::Cosine { warmup_steps, min_factor: 0.0 }),
        1 => (1usize..10).prop_map(|step_size| ScheduleSpec::Step { step_size, gamma: 0.5 }),
    ]
}

fn clip() -> impl Strategy<Value = ClipSpec> {
    prop_oneof![
        3 => Just(ClipSpec::None),
        1 => prop_oneof![Just(1.0), Just(0.1)].prop_map(|max_norm| ClipSpec::Norm { max_norm }),
        1 => Just(ClipSpec::Value { value: 1.0 }),
    ]
}

fn precision() -> impl Strategy<Value = Precision> {
    prop_oneof![
        12 => Just(Precision::F32),
        1 => Just(Precision::F64),
        2 => Just(Precision::F16),
        2 => Just(Precision::Bf16),
        3 => prop_oneof![Just(HalfType::F16), Just(HalfType::Bf16)].prop_map(|compute| Precision::Mixed {
            compute,
            loss_scaling: LossScaling::default(),
        }),
    ]
}

/// The documented safe envelope: stable losses, eps ≥ 1e-8 (Adam-type) and
/// norm eps ≥ 1e-5, gradient clipping on, LR at or below the family's
/// recommended value, f32, clean data with |scale| ≤ 10, no augmentation
/// traps and additive noise with std ≤ 1.
/// The highest learning rate the safe envelope allows a family.
pub fn recommended_lr(family: &str) -> f64 {
    match family {
        "transformer" => 1e-3,
        _ => 3e-3,
    }
}

/// The smallest optimizer eps the safe envelope allows.
pub const SAFE_EPS: f64 = 1e-8;

/// Holds `case` inside the documented safe envelope: f32, clean data at a bounded scale, mild augmentations, a stable loss, at most the family's recommended learning rate, an optimizer eps of at least [`SAFE_EPS`], gradients clipped to norm 1, a bounded init gain and every norm's eps at least 1e-5.
pub fn safe_envelope(case: &mut Case) {
    let recommended = recommended_lr(case.family());
    case.precision = Precision::F32;
    case.data.pathologies.clear();
    case.data.scale = case.data.scale.min(10.0);
    case.data.offset = 0.0;
    case.data.distribution = Distribution::Normal;
    case.augment.retain(|a| {
        matches!(
            a,
            Augment::GaussianNoise { .. } | Augment::ColorJitter { .. } | Augment::Mixup { .. }
        )
    });
    // Noise far above the data's scale is a data fault, not an augmentation
    // (the safe_envelope fuzz target found std 1e30 overflowing attention).
    for a in &mut case.augment {
        if let Augment::GaussianNoise { std } = a {
            *std = std.min(1.0);
        }
    }
    case.loss = match case.loss {
        LossSpec::CrossEntropy { label_smoothing } => LossSpec::CrossEntropy { label_smoothing },
        LossSpec::Huber { delta } => LossSpec::Huber { delta },
        LossSpec::Mse { .. } => LossSpec::Mse {
            root: false,
            eps: 0.0,
        },
        LossSpec::BceWithLogits | LossSpec::Bce { .. } => LossSpec::BceWithLogits,
        _ => LossSpec::CrossEntropy {
            label_smoothing: 0.0,
        },
    };
    let lr = case.optimizer.lr().min(recommended);
    case.optimizer.set_lr(lr);
    if let Some(eps) = case.optimizer.eps_mut() {
        *eps = eps.max(SAFE_EPS);
    }
    case.clip = ClipSpec::Norm { max_norm: 1.0 };
    let init = case.model.init_mut();
    init.gain = init.gain.min(2.0);
    match &mut case.model {
        ModelSpec::Cnn(m) => {
            for b in &mut m.blocks {
                if let Some(e) = &mut b.batch_norm_eps {
                    *e = e.max(1e-5);
                }
            }
        }
        ModelSpec::Transformer(t) => {
            t.norm_eps = t.norm_eps.max(1e-5);
            t.attention_scale = AttentionScale::InvSqrtD;
        }
        ModelSpec::Decoder(d) => d.rms_eps = d.rms_eps.max(1e-5),
        ModelSpec::Encoder(e) => {
            e.norm_eps = e.norm_eps.max(1e-5);
            e.attention_scale = AttentionScale::InvSqrtD;
            e.mask = MaskKind::default();
            e.min_length = e.min_length.max(1);
        }
        ModelSpec::Rnn(_) | ModelSpec::Custom(_) => {}
    }
}

/// Valid cases under `opts`: the `drawn` cases that validate (a guard:
/// the draws are made, and tested, to be valid almost always, so that
/// proptest's rejection budget is never at risk).
pub fn case(opts: &StrategyOptions) -> BoxedStrategy<Case> {
    let limits = Limits::default();
    drawn(opts)
        .prop_filter("the case must be valid", move |c| {
            c.validate(&limits).is_ok()
        })
        .boxed()
}

/// The models drawn: the base case's (its knobs drawn within their ranges),
/// or one of the families'.
fn models(opts: &StrategyOptions) -> BoxedStrategy<ModelSpec> {
    let Some(base) = &opts.base else {
        let families: Vec<BoxedStrategy<ModelSpec>> =
            opts.families.iter().map(|f| model(f)).collect();
        return proptest::strategy::Union::new(families).boxed();
    };
    let spec = base.model.clone();
    let knobs = spec.knobs().map_or(0, |k| k.len());
    proptest::collection::vec(
        prop_oneof![1 => Just(None), 2 => (0.0..=1.0f64).prop_map(Some)],
        knobs,
    )
    .prop_map(move |draws| {
        let mut spec = spec.clone();
        if let Some(knobs) = spec.knobs_mut() {
            for ((_, k), u) in knobs.iter_mut().zip(draws) {
                if let Some(u) = u {
                    k.value = k.at(u);
                }
            }
        }
        spec
    })
    .boxed()
}

/// The base case's own parts a drawn case keeps: its data source (with
/// drawn pathologies; for synthetic data the drawn scale, offset and
/// noise too) and a loss of its own.
fn fit_to_base(c: &mut Case, base: &Case) {
    if !base.data.source.is_synthetic() {
        // The user's dataset as given, with the drawn pathologies and, for
        // real inputs, the drawn rescaling on top.
        let drawn = std::mem::take(&mut c.data);
        let rescale = !c.model.input().is_tokens();
        c.data = DataSpec {
            pathologies: drawn.pathologies,
            scale: if rescale {
                base.data.scale * drawn.scale
            } else {
                base.data.scale
            },
            offset: if rescale {
                base.data.offset + drawn.offset
            } else {
                base.data.offset
            },
            ..base.data.clone()
        };
    }
    if matches!(base.loss, LossSpec::Custom { .. }) {
        c.loss = base.loss.clone();
    }
    c.divergence_factor = base.divergence_factor;
}

/// Cases under `opts`, drawn part by part and fitted to their model.
fn drawn(opts: &StrategyOptions) -> BoxedStrategy<Case> {
    let model = models(opts);
    let base = opts.base.clone();
    let clean = opts.clean_data || opts.safe_envelope;
    let safe = opts.safe_envelope;
    let dataset = opts.dataset.clone();
    let large = opts.scale == ModelScale::Large;
    (
        (any::<u64>(), 3usize..=opts.max_steps.max(3), 2usize..=16),
        model,
        data(clean),
        proptest::collection::vec(augmentation(), 0..=2),
        loss(),
        optimizer(),
        schedule(),
        clip(),
        precision(),
    )
        .prop_map(
            move |(
                (seed, steps, mut batch_size),
                mut model,
                data,
                augment,
                loss,
                optimizer,
                schedule,
                clip,
                precision,
            )| {
                // Scaled after the draw and before the fits below (a
                // dataset's sizes are its own): a seed draws the same knobs
                // at either scale.
                if large {
                    scaled_up(&mut model);
                    batch_size *= LARGE;
                }
                let mut c = Case {
                    format: FORMAT_VERSION,
                    seed: seed % 1000,
                    device: DeviceSpec::Cpu,
                    precision,
                    steps,
                    batch_size,
                    model,
                    data,
                    augment,
                    loss,
                    optimizer,
                    schedule,
                    clip,
                    divergence_factor: 4.0,
                };
                if let Some(fit) = &dataset {
                    fit_to_dataset(&mut c, fit);
                }
                if let Some(base) = &base {
                    fit_to_base(&mut c, base);
                }
                fit_to_model(&mut c);
                if safe {
                    safe_envelope(&mut c);
                }
                c
            },
        )
        .boxed()
}

/// Drops the parts a drawn model cannot take (augmentations on tokens,
/// image-only augmentations on sequences, label faults on non-label losses).
fn fit_to_model(c: &mut Case) {
    let input = c.model.input();
    c.augment.retain(|a| match input {
        InputSpec::Tokens { .. } => false,
        InputSpec::Image { .. } => !matches!(a, Augment::TimeMask { .. }),
        _ => !a.image_only(),
    });
    let labels = c.loss.target_kind() == TargetKind::Labels;
    c.data.pathologies.retain(|p| match p {
        Pathology::LabelOutOfRange { .. } => labels,
        _ => !input.is_tokens(),
    });
}

/// Fits a drawn case to a dataset: the model reads its samples and predicts
/// its classes, and the data is the file's (pathologies still apply).
fn fit_to_dataset(c: &mut Case, fit: &DatasetFit) {
    let (seq_len, features) = fit.sequence();
    match &mut c.model {
        ModelSpec::Cnn(m) => {
            let (ch, h, w) = match fit.dims.as_slice() {
                [ch, h, w] => (*ch, *h, *w),
                [h, w] => (1, *h, *w),
                _ => (1, 1, fit.dims.iter().product()),
            };
            (m.channels, m.height, m.width, m.classes) = (ch, h, w, fit.classes);
            // A residual block needs the channel count it is given.
            m.fix_residuals();
        }
        ModelSpec::Rnn(r) => {
            (r.seq_len, r.features, r.classes) = (seq_len, features, fit.classes);
        }
        ModelSpec::Transformer(t) => {
            t.input = match (t.input, fit.vocab) {
                (TokenOrContinuous::Tokens { .. }, Some(vocab)) if fit.dims.len() == 1 => {
                    TokenOrContinuous::Tokens { vocab }
                }
                _ => TokenOrContinuous::Continuous { features },
            };
            t.seq_len = if matches!(t.input, TokenOrContinuous::Tokens { .. }) {
                fit.dims[0]
            } else {
                seq_len
            };
            t.classes = fit.classes;
            if fit.per_token {
                t.head = HeadKind::PerToken;
            }
        }
        // A language model reads token files only (it predicts their next
        // token); on other data the case is rejected as not fitting.
        ModelSpec::Decoder(d) => {
            if let (Some(vocab), [seq_len]) = (fit.vocab, fit.dims.as_slice()) {
                (d.vocab, d.seq_len) = (vocab, *seq_len);
            }
        }
        ModelSpec::Encoder(e) => {
            if let (Some(vocab), [seq_len]) = (fit.vocab, fit.dims.as_slice()) {
                (e.vocab, e.seq_len, e.classes) = (vocab, *seq_len, fit.classes);
                e.min_length = e.min_length.min(*seq_len);
            }
        }
        ModelSpec::Custom(_) => {}
    }
    let pathologies = std::mem::take(&mut c.data.pathologies);
    c.data = DataSpec {
        pathologies,
        source: SourceSpec::File(fit.source.clone()),
        ..DataSpec::default()
    };
}

/// The case a seed draws: deterministic, independent of any test runner.
pub fn generate(opts: &StrategyOptions, seed: u64) -> Case {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&0x6e61_6e68_756e_7400u64.to_le_bytes()); // "nanhunt\0"
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    case(opts)
        .new_tree(&mut runner)
        .expect("the strategy finds a valid case within proptest's rejection budget")
        .current()
}

/// A random nudge of one knob (the neighbourhood of a finding): the
/// learning rate, data seed, precision, steps, input scale, clipping, batch
/// size, or a value in the range of one of the model's declared knobs.
pub fn mutate(base: &Case, rng: &mut crate::rng::Rng) -> Case {
    let mut c = base.clone();
    // A model's declared knobs are one more thing to vary.
    let knobs: Vec<String> = base
        .model
        .knobs()
        .into_iter()
        .flatten()
        .map(|(n, _)| n.clone())
        .collect();
    let arms = 7 + usize::from(!knobs.is_empty());
    match rng.below(arms) {
        7 => {
            let name = &knobs[rng.below(knobs.len())];
            if let Some(k) = c.model.knobs_mut().and_then(|k| k.get_mut(name)) {
                k.value = k.at(rng.uniform());
            }
        }
        0 => {
            let lr = c.optimizer.lr() * 10f64.powf(rng.uniform_in(-1.0, 1.0));
            c.optimizer.set_lr(lr);
        }
        1 => c.seed = rng.next_u64() % 1000,
        2 => {
            c.precision = match rng.below(4) {
                0 => Precision::F32,
                1 => Precision::F16,
                2 => Precision::Bf16,
                _ => Precision::Mixed {
                    compute: HalfType::F16,
                    loss_scaling: LossScaling::default(),
                },
            }
        }
        3 => c.steps = (c.steps * 2).min(60),
        // A dataset's values are its own: its cases get another knob.
        4 if !c.data.source.is_synthetic() => c.clip = ClipSpec::None,
        4 => c.data.scale *= 10f64.powf(rng.uniform_in(-1.0, 1.0)),
        5 => c.clip = ClipSpec::None,
        // A large campaign's batches stay in its range (up to the case's).
        _ => c.batch_size = 1 + rng.below(base.batch_size.max(16)),
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_vary_a_declared_knob_within_its_range() {
        let mut c = Case::example("cnn").unwrap();
        let mut knobs = std::collections::BTreeMap::new();
        knobs.insert(
            "ln_eps".to_string(),
            KnobSpec {
                value: 1e-12,
                min: 1e-12,
                max: 1e-3,
                stage: None,
            },
        );
        c.model = ModelSpec::Custom(CustomSpec {
            name: "m".into(),
            input: InputSpec::Vector { features: 4 },
            outputs: 2,
            init: InitSpec::default(),
            per_token: false,
            frozen: Vec::new(),
            knobs,
            init_overrides: Default::default(),
        });
        let values: Vec<f64> = (0..64)
            .map(|i| {
                let mut rng = crate::rng::Rng::keyed(0, "test.mutate", i);
                mutate(&c, &mut rng).model.knobs().unwrap()["ln_eps"].value
            })
            .filter(|&v| v != 1e-12)
            .collect();
        assert!(values.len() >= 4, "{values:?}");
        assert!(
            values.iter().all(|v| (1e-12..=1e-3).contains(v)),
            "{values:?}"
        );
        // Spread by magnitude: some below 1e-9, some above 1e-6.
        assert!(
            values.iter().any(|&v| v < 1e-9) && values.iter().any(|&v| v > 1e-6),
            "{values:?}"
        );
    }

    #[test]
    fn drawn_cases_are_valid_before_the_filter() {
        for opts in [
            StrategyOptions::default(),
            StrategyOptions {
                safe_envelope: true,
                ..StrategyOptions::default()
            },
        ] {
            let mut runner = TestRunner::deterministic();
            let strategy = drawn(&opts);
            let draws = 400;
            let invalid: Vec<String> = (0..draws)
                .filter_map(|_| {
                    let c = strategy.new_tree(&mut runner).unwrap().current();
                    c.validate(&Limits::default()).err().map(|e| e.to_string())
                })
                .collect();
            // Measured: 33 of 400 (default options), all for one of two
            // reasons the draws do not avoid (fixing them would change every
            // generated campaign); any other reason is a draw to fix.
            assert!(
                invalid.len() * 10 <= draws,
                "{} of {draws}: {invalid:?}",
                invalid.len()
            );
            for reason in &invalid {
                assert!(
                    reason.contains("bf16 convolutions are not supported on CPU")
                        || reason.contains("2x2 pooling needs a feature map of at least 2x2"),
                    "{reason}"
                );
            }
        }
    }

    /// A campaign over a user's model: its knob drawn in range, its
    /// dataset kept (with pathologies and rescaling on top), its loss kept,
    /// and everything else (optimizer, rate, precision, steps) drawn.
    #[test]
    fn campaigns_over_a_users_model_draw_around_its_case() {
        let mut base = Case::example("cnn").unwrap();
        base.model = ModelSpec::Custom(
            CustomSpec::new("mine", InputSpec::Vector { features: 4 }, 3)
                .knob("eps", KnobSpec::new(1e-6, 1e-12, 1e-2)),
        );
        base.data.source = SourceSpec::User {
            name: "loader".into(),
            sampling: Default::default(),
        };
        base.loss = LossSpec::Custom {
            name: "my_loss".into(),
            targets: crate::spec::TargetKind::Labels,
        };
        let opts = StrategyOptions {
            families: vec!["mine".into()],
            base: Some(base.clone()),
            ..StrategyOptions::default()
        };
        let cases: Vec<Case> = (0..60).map(|s| generate(&opts, s)).collect();
        let eps: Vec<f64> = cases
            .iter()
            .map(|c| c.model.knobs().unwrap()["eps"].value)
            .collect();
        assert!(eps.iter().all(|v| (1e-12..=1e-2).contains(v)), "{eps:?}");
        assert!(eps.iter().any(|&v| v != 1e-6), "{eps:?}");
        for c in &cases {
            assert_eq!(c.family(), "mine");
            assert_eq!(c.data.source, base.data.source);
            assert_eq!(c.loss, base.loss);
        }
        let varied = |f: &dyn Fn(&Case) -> String| {
            cases
                .iter()
                .map(f)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                > 1
        };
        assert!(varied(&|c| c.optimizer.name().to_string()));
        assert!(varied(&|c| c.precision.name().to_string()));
        assert!(varied(&|c| format!("{:?}", c.data.pathologies)));
        assert!(varied(&|c| format!("{}", c.data.scale)));
        assert!(cases.iter().any(|c| !c.augment.is_empty()));
    }

    #[test]
    fn options_naming_an_unknown_family_are_refused() {
        let bad = StrategyOptions {
            families: vec!["mlp".into()],
            ..StrategyOptions::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("`families`") && e.contains("`mlp`"), "{e}");
        assert!(StrategyOptions::default().validate().is_ok());
    }

    #[test]
    fn generation_is_deterministic_and_varied() {
        let opts = StrategyOptions::default();
        assert_eq!(generate(&opts, 7), generate(&opts, 7));
        let families: std::collections::BTreeSet<String> = (0..40)
            .map(|s| generate(&opts, s).family().to_string())
            .collect();
        assert_eq!(families.len(), FAMILIES.len(), "{families:?}");
    }

    fn at_scale(scale: ModelScale) -> StrategyOptions {
        StrategyOptions {
            scale,
            ..StrategyOptions::default()
        }
    }

    #[test]
    fn a_large_draw_is_the_small_draw_of_its_seed_scaled_up() {
        let (small, large) = (at_scale(ModelScale::Small), at_scale(ModelScale::Large));
        let mut same = 0;
        for seed in 0..60 {
            let drawn = generate(&large, seed);
            let mut want = generate(&small, seed);
            scaled_up(&mut want.model);
            want.batch_size *= LARGE;
            if drawn == want {
                same += 1;
                continue;
            }
            // Otherwise the small campaign drew again: the first draw cannot
            // be built small (a CNN pooling its image to nothing) and can large.
            let mut first = drawn.clone();
            first.batch_size /= LARGE;
            let ModelSpec::Cnn(m) = &mut first.model else {
                panic!("seed {seed}: {drawn:?} is not {want:?} scaled up")
            };
            (m.height, m.width) = (m.height / LARGE, m.width / LARGE);
            m.blocks.iter_mut().for_each(|b| b.channels /= LARGE);
            assert!(first.validate(&Limits::default()).is_err(), "seed {seed}");
        }
        assert!(same >= 50, "{same} of 60");
    }

    /// The widths a model trains at: (its widest layer, its sequence or
    /// image side).
    fn widths(m: &ModelSpec) -> (usize, usize) {
        match m {
            ModelSpec::Cnn(c) => (c.blocks.iter().map(|b| b.channels).max().unwrap(), c.height),
            ModelSpec::Transformer(t) => (t.d_model, t.seq_len),
            ModelSpec::Rnn(r) => (r.hidden, r.seq_len),
            ModelSpec::Decoder(d) => (d.d_model, d.seq_len),
            ModelSpec::Encoder(e) => (e.d_model, e.seq_len),
            ModelSpec::Custom(_) => unreachable!("built-in families only"),
        }
    }

    #[test]
    fn large_cases_reach_the_sizes_users_train_and_each_family_trains_there() {
        let large = at_scale(ModelScale::Large);
        let mut trained = std::collections::BTreeSet::new();
        let (mut widest, mut longest, mut batch) = (0, 0, 0);
        for seed in 0..80 {
            let mut c = generate(&large, seed);
            assert!(c.validate(&Limits::default()).is_ok(), "seed {seed}");
            assert!(
                (8..=64).contains(&c.batch_size),
                "seed {seed}: {}",
                c.batch_size
            );
            let (w, l) = widths(&c.model);
            (widest, longest, batch) = (widest.max(w), longest.max(l), batch.max(c.batch_size));
            // One case of each family trains two steps at its drawn scale,
            // without a model or data error (unstable is a finding, not one).
            if trained.insert(c.family().to_string()) {
                c.steps = 2;
                let outcome = crate::training::run(&c);
                assert!(outcome.is_ok(), "seed {seed}: {outcome:?}");
            }
        }
        assert_eq!(trained.len(), FAMILIES.len(), "{trained:?}");
        // The draws reach the families' `--size large` cases (width 64,
        // sequences of 32, images of 32×32, batch 32) and beyond.
        assert!(
            widest >= 64 && longest >= 32 && batch >= 48,
            "{widest} {longest} {batch}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn generated_cases_are_valid_and_round_trip_through_json(c in case(&StrategyOptions::default())) {
            prop_assert!(c.validate(&Limits::default()).is_ok());
            let back = Case::from_json(&c.to_json()).unwrap();
            prop_assert_eq!(back, c);
        }

        #[test]
        fn restricted_strategies_respect_their_restrictions(c in case(&StrategyOptions {
            families: vec!["rnn".into()],
            clean_data: true,
            ..StrategyOptions::default()
        })) {
            prop_assert_eq!(c.family(), "rnn");
            prop_assert!(c.data.pathologies.is_empty());
        }

        #[test]
        fn safe_envelope_cases_are_inside_it(c in case(&StrategyOptions { safe_envelope: true, ..StrategyOptions::default() })) {
            prop_assert_eq!(c.precision.clone(), Precision::F32);
            let clipped = matches!(c.clip, ClipSpec::Norm { max_norm } if max_norm <= 1.0);
            prop_assert!(clipped);
            prop_assert!(c.data.pathologies.is_empty());
            // The fields that need thought, not only the ones set outright.
            prop_assert!(c.optimizer.lr() <= recommended_lr(c.family()), "lr {}", c.optimizer.lr());
            if let Some(eps) = c.optimizer.eps() {
                prop_assert!(eps >= SAFE_EPS, "eps {eps}");
            }
            prop_assert!(c.model.init().gain <= 2.0);
            prop_assert!(c.data.scale <= 10.0 && c.data.offset == 0.0);
            for a in &c.augment {
                let noise_ok = !matches!(a, Augment::GaussianNoise { std } if *std > 1.0);
                prop_assert!(noise_ok, "{a:?}");
                let kind_ok = matches!(
                    a,
                    Augment::GaussianNoise { .. } | Augment::ColorJitter { .. } | Augment::Mixup { .. }
                );
                prop_assert!(kind_ok, "{a:?}");
            }
            match &c.model {
                ModelSpec::Transformer(t) => {
                    prop_assert_eq!(t.attention_scale, AttentionScale::InvSqrtD);
                    prop_assert!(t.norm_eps >= 1e-5);
                }
                ModelSpec::Cnn(m) => {
                    for b in &m.blocks {
                        prop_assert!(b.batch_norm_eps.is_none_or(|e| e >= 1e-5));
                    }
                }
                _ => {}
            }
        }
    }
}
