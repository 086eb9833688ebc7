//! Model configurations of the built-in families (and the shape of a user's model).

use serde::{Deserialize, Serialize};

/// A model configuration: a built-in family's, or the shape of a user's own model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelSpec {
    /// A convolutional classifier over images.
    Cnn(CnnSpec),
    /// A Transformer over tokens or continuous sequences.
    Transformer(TransformerSpec),
    /// A recurrent network (tanh RNN, LSTM or GRU) over sequences.
    Rnn(RnnSpec),
    /// A Llama-style language model: RMSNorm, rotary positions,
    /// grouped-query causal attention, a SwiGLU MLP, next-token targets.
    Decoder(DecoderSpec),
    /// A BERT-style encoder over padded token sequences: learned positions,
    /// post-norm blocks, an attention mask over the padding, a head on the
    /// first token.
    Encoder(EncoderSpec),
    /// A user's own model, built by code the caller passes to the runner; the
    /// case only says what data it eats and how many outputs it has.
    Custom(CustomSpec),
}

impl ModelSpec {
    /// The family's name as signatures give it (`cnn`, …; a custom model's own name).
    pub fn family(&self) -> &str {
        match self {
            ModelSpec::Cnn(_) => "cnn",
            ModelSpec::Transformer(_) => "transformer",
            ModelSpec::Rnn(_) => "rnn",
            ModelSpec::Decoder(_) => "decoder",
            ModelSpec::Encoder(_) => "encoder",
            ModelSpec::Custom(c) => &c.name,
        }
    }

    /// What the data generator must produce for this model.
    pub fn input(&self) -> InputSpec {
        match self {
            ModelSpec::Cnn(c) => InputSpec::Image {
                channels: c.channels,
                height: c.height,
                width: c.width,
            },
            ModelSpec::Transformer(t) => match t.input {
                TokenOrContinuous::Tokens { vocab } => InputSpec::Tokens {
                    seq_len: t.seq_len,
                    vocab,
                },
                TokenOrContinuous::Continuous { features } => InputSpec::Sequence {
                    seq_len: t.seq_len,
                    features,
                },
            },
            ModelSpec::Rnn(r) => InputSpec::Sequence {
                seq_len: r.seq_len,
                features: r.features,
            },
            ModelSpec::Decoder(d) => InputSpec::Tokens {
                seq_len: d.seq_len,
                vocab: d.vocab,
            },
            ModelSpec::Encoder(e) => InputSpec::Tokens {
                seq_len: e.seq_len,
                vocab: e.vocab,
            },
            ModelSpec::Custom(c) => c.input.clone(),
        }
    }

    /// The number of outputs per prediction (classes, or the vocabulary).
    pub fn classes(&self) -> usize {
        match self {
            ModelSpec::Cnn(c) => c.classes,
            ModelSpec::Transformer(t) => t.classes,
            ModelSpec::Rnn(r) => r.classes,
            ModelSpec::Decoder(d) => d.vocab,
            ModelSpec::Encoder(e) => e.classes,
            ModelSpec::Custom(c) => c.outputs,
        }
    }

    /// Whether the model predicts one output per sequence position.
    pub fn per_token(&self) -> bool {
        match self {
            ModelSpec::Transformer(t) => t.head == HeadKind::PerToken,
            ModelSpec::Decoder(_) => true,
            ModelSpec::Custom(c) => c.per_token,
            _ => false,
        }
    }

    /// Whether each position's target is the next token (a language
    /// model's objective) rather than a label of the position itself.
    pub fn next_token(&self) -> bool {
        matches!(self, ModelSpec::Decoder(_))
    }

    /// The shortest sequence before padding (token 0), for a model that
    /// reads padded sequences.
    pub fn padding(&self) -> Option<usize> {
        match self {
            ModelSpec::Encoder(e) => Some(e.min_length),
            _ => None,
        }
    }

    /// The attention-logit scaling of a family with attention.
    pub fn attention_scale(&self) -> Option<AttentionScale> {
        match self {
            ModelSpec::Transformer(t) => Some(t.attention_scale),
            ModelSpec::Decoder(d) => Some(d.attention_scale),
            ModelSpec::Encoder(e) => Some(e.attention_scale),
            _ => None,
        }
    }

    /// Sets the attention scale of a family with attention (others are unchanged).
    pub fn set_attention_scale(&mut self, scale: AttentionScale) {
        match self {
            ModelSpec::Transformer(t) => t.attention_scale = scale,
            ModelSpec::Decoder(d) => d.attention_scale = scale,
            ModelSpec::Encoder(e) => e.attention_scale = scale,
            _ => {}
        }
    }

    /// A custom model's init overrides (built-in families have none).
    pub fn init_overrides(&self) -> Vec<(String, InitOverride)> {
        match self {
            ModelSpec::Custom(c) => c
                .init_overrides
                .iter()
                .map(|(n, o)| (n.clone(), *o))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// A custom model's declared knobs (built-in families have none).
    pub fn knobs(&self) -> Option<&std::collections::BTreeMap<String, KnobSpec>> {
        match self {
            ModelSpec::Custom(c) => Some(&c.knobs),
            _ => None,
        }
    }

    /// A custom model's declared knobs, to change (built-in families have none).
    pub fn knobs_mut(&mut self) -> Option<&mut std::collections::BTreeMap<String, KnobSpec>> {
        match self {
            ModelSpec::Custom(c) => Some(&mut c.knobs),
            _ => None,
        }
    }

    /// A custom model's frozen list, to extend (built-in families have none).
    pub fn frozen_mut(&mut self) -> Option<&mut Vec<String>> {
        match self {
            ModelSpec::Custom(c) => Some(&mut c.frozen),
            _ => None,
        }
    }

    /// The tensors a custom model declares frozen (built-in families train all).
    pub fn frozen(&self) -> &[String] {
        match self {
            ModelSpec::Custom(c) => &c.frozen,
            _ => &[],
        }
    }

    /// The family's initialization.
    pub fn init(&self) -> InitSpec {
        match self {
            ModelSpec::Cnn(c) => c.init,
            ModelSpec::Transformer(t) => t.init,
            ModelSpec::Rnn(r) => r.init,
            ModelSpec::Decoder(d) => d.init,
            ModelSpec::Encoder(e) => e.init,
            ModelSpec::Custom(c) => c.init,
        }
    }

    /// The initialization, to change it (every family has one).
    pub fn init_mut(&mut self) -> &mut InitSpec {
        match self {
            ModelSpec::Cnn(c) => &mut c.init,
            ModelSpec::Transformer(t) => &mut t.init,
            ModelSpec::Rnn(r) => &mut r.init,
            ModelSpec::Decoder(d) => &mut d.init,
            ModelSpec::Encoder(e) => &mut e.init,
            ModelSpec::Custom(c) => &mut c.init,
        }
    }
}

/// The input a model consumes, per sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum InputSpec {
    /// C×H×W images.
    Image {
        /// Input channels.
        channels: usize,
        /// Image height.
        height: usize,
        /// Image width.
        width: usize,
    },
    /// Integer token ids in [0, vocab).
    Tokens {
        /// Tokens per sample.
        seq_len: usize,
        /// The vocabulary size.
        vocab: usize,
    },
    /// seq_len × features real-valued sequences.
    Sequence {
        /// Steps per sample.
        seq_len: usize,
        /// Values per step.
        features: usize,
    },
    /// A flat feature vector.
    Vector {
        /// Values per sample.
        features: usize,
    },
}

impl InputSpec {
    /// Per-sample element count.
    pub fn numel(&self) -> usize {
        match *self {
            InputSpec::Image {
                channels,
                height,
                width,
            } => channels * height * width,
            InputSpec::Tokens { seq_len, .. } => seq_len,
            InputSpec::Sequence { seq_len, features } => seq_len * features,
            InputSpec::Vector { features } => features,
        }
    }

    /// The per-sample dimensions of a batch.
    pub fn dims(&self) -> Vec<usize> {
        match *self {
            InputSpec::Image {
                channels,
                height,
                width,
            } => vec![channels, height, width],
            InputSpec::Tokens { seq_len, .. } => vec![seq_len],
            InputSpec::Sequence { seq_len, features } => vec![seq_len, features],
            InputSpec::Vector { features } => vec![features],
        }
    }

    /// Whether the input is token ids.
    pub fn is_tokens(&self) -> bool {
        matches!(self, InputSpec::Tokens { .. })
    }
}

/// How weights are drawn at initialization.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InitScheme {
    /// He et al.: std = gain / sqrt(fan_in).
    Kaiming,
    /// Glorot: std = gain * sqrt(2 / (fan_in + fan_out)).
    Xavier,
}

/// A family's initialization: the scheme and its gain.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InitSpec {
    /// The scheme weights are drawn by.
    pub scheme: InitScheme,
    /// Multiplies the scheme's standard deviation (1.0 = the textbook init).
    pub gain: f64,
}

impl Default for InitSpec {
    fn default() -> Self {
        InitSpec {
            scheme: InitScheme::Kaiming,
            gain: 1.0,
        }
    }
}

/// An activation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// max(x, 0).
    Relu,
    /// The Gaussian error linear unit (erf form).
    Gelu,
    /// The hyperbolic tangent.
    Tanh,
    /// The logistic sigmoid.
    Sigmoid,
    /// max(x, 0.01·x).
    LeakyRelu,
}

/// Pooling after a convolutional block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    /// 2×2 max pooling, stride 2.
    Max,
    /// 2×2 average pooling, stride 2.
    Avg,
    /// No pooling.
    None,
}

/// One convolutional block: convolution, optional batch-norm, activation, optional residual and pooling.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvBlockSpec {
    /// Output channels.
    pub channels: usize,
    /// The square kernel's size (padding keeps the spatial size).
    #[serde(default = "default_kernel")]
    pub kernel: usize,
    /// Batch normalization with this eps; absent means no batch-norm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_norm_eps: Option<f64>,
    /// The activation after the convolution.
    #[serde(default = "default_activation")]
    pub activation: Activation,
    /// Add the block's input to its output (needs equal channel counts).
    #[serde(default)]
    pub residual: bool,
    /// 2×2, stride-2 pooling after the block.
    #[serde(default = "default_pool")]
    pub pool: Pool,
}

fn default_kernel() -> usize {
    3
}
fn default_activation() -> Activation {
    Activation::Relu
}
fn default_pool() -> Pool {
    Pool::None
}

/// A convolutional classifier: blocks, then a linear head.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CnnSpec {
    /// Input channels.
    pub channels: usize,
    /// Input height.
    pub height: usize,
    /// Input width.
    pub width: usize,
    /// Output classes.
    pub classes: usize,
    /// The convolutional blocks, in order.
    pub blocks: Vec<ConvBlockSpec>,
    /// How the weights are drawn.
    #[serde(default)]
    pub init: InitSpec,
}

impl CnnSpec {
    /// Residual blocks need equal channels in and out: drops the residual
    /// connections a change of channel counts broke.
    pub fn fix_residuals(&mut self) {
        let mut ch = self.channels;
        for b in &mut self.blocks {
            if b.residual && b.channels != ch {
                b.residual = false;
            }
            ch = b.channels;
        }
    }
}

/// What a Transformer reads.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TokenOrContinuous {
    /// Token ids, embedded.
    Tokens {
        /// The vocabulary size.
        vocab: usize,
    },
    /// Continuous vectors, projected.
    Continuous {
        /// Values per position.
        features: usize,
    },
}

/// Where a Transformer block normalizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormPlacement {
    /// Before attention and the MLP (pre-norm).
    Pre,
    /// After each residual addition (post-norm, the original paper's).
    Post,
    /// No normalization.
    None,
}

/// How attention scores are scaled before the softmax.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionScale {
    /// Scores divided by sqrt(head_dim), as in the paper.
    InvSqrtD,
    /// Unscaled scores: large logits, saturated softmax.
    None,
}

/// What a Transformer predicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadKind {
    /// Mean-pool the sequence, one prediction per sample.
    Classify,
    /// One prediction per position.
    PerToken,
}

/// A Transformer encoder with a classification or per-token head.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformerSpec {
    /// Tokens or continuous inputs.
    pub input: TokenOrContinuous,
    /// Positions per sample.
    pub seq_len: usize,
    /// The model width.
    pub d_model: usize,
    /// Attention heads (divide `d_model`).
    pub heads: usize,
    /// Blocks.
    pub layers: usize,
    /// The MLP's hidden width as a multiple of `d_model`.
    #[serde(default = "default_mlp_ratio")]
    pub mlp_ratio: usize,
    /// Where the blocks normalize.
    #[serde(default = "default_norm")]
    pub norm: NormPlacement,
    /// The layer-norm epsilon.
    #[serde(default = "default_norm_eps")]
    pub norm_eps: f64,
    /// How attention scores are scaled.
    #[serde(default = "default_attention_scale")]
    pub attention_scale: AttentionScale,
    /// Masks attention to earlier positions.
    #[serde(default)]
    pub causal: bool,
    /// One prediction per sample or per position.
    #[serde(default = "default_head")]
    pub head: HeadKind,
    /// Output classes.
    pub classes: usize,
    /// How the weights are drawn.
    #[serde(default = "default_xavier")]
    pub init: InitSpec,
}

fn default_mlp_ratio() -> usize {
    2
}
fn default_norm() -> NormPlacement {
    NormPlacement::Pre
}
fn default_norm_eps() -> f64 {
    1e-5
}
fn default_attention_scale() -> AttentionScale {
    AttentionScale::InvSqrtD
}
fn default_head() -> HeadKind {
    HeadKind::Classify
}
fn default_xavier() -> InitSpec {
    InitSpec {
        scheme: InitScheme::Xavier,
        gain: 1.0,
    }
}

/// The recurrent cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellKind {
    /// Vanilla Elman RNN with tanh.
    Rnn,
    /// Long short-term memory.
    Lstm,
    /// Gated recurrent unit.
    Gru,
}

/// A recurrent classifier over sequences: stacked layers, a head on the last step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RnnSpec {
    /// The cell.
    pub cell: CellKind,
    /// Values per step.
    pub features: usize,
    /// Steps per sample.
    pub seq_len: usize,
    /// The hidden state's width.
    pub hidden: usize,
    /// Stacked layers.
    #[serde(default = "default_layers")]
    pub layers: usize,
    /// Output classes.
    pub classes: usize,
    /// How the weights are drawn.
    #[serde(default = "default_xavier")]
    pub init: InitSpec,
}

fn default_layers() -> usize {
    1
}

/// A Llama-style decoder: token embedding, `layers` pre-norm blocks of
/// RMSNorm → grouped-query causal self-attention with rotary positions →
/// RMSNorm → SwiGLU MLP, a final RMSNorm and a per-position head over the
/// vocabulary, trained on the next token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecoderSpec {
    /// The vocabulary size.
    pub vocab: usize,
    /// Tokens per sample.
    pub seq_len: usize,
    /// The model width.
    pub d_model: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention): divides `heads`.
    pub kv_heads: usize,
    /// Blocks.
    pub layers: usize,
    /// The SwiGLU hidden width as a multiple of `d_model`.
    #[serde(default = "default_mlp_ratio")]
    pub mlp_ratio: usize,
    /// The RMSNorm epsilon.
    #[serde(default = "default_norm_eps")]
    pub rms_eps: f64,
    /// The rotary embedding's base.
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// How attention scores are scaled.
    #[serde(default = "default_attention_scale")]
    pub attention_scale: AttentionScale,
    /// How the weights are drawn.
    #[serde(default = "default_xavier")]
    pub init: InitSpec,
}

fn default_rope_theta() -> f64 {
    10_000.0
}

/// A BERT-style encoder. Token 0 is padding: each sample is a sequence of
/// `min_length..=seq_len` tokens padded at the end, and attention ignores
/// the padded keys through `mask`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncoderSpec {
    /// The vocabulary size.
    pub vocab: usize,
    /// Tokens per sample, padding included.
    pub seq_len: usize,
    /// The model width.
    pub d_model: usize,
    /// Attention heads (divide `d_model`).
    pub heads: usize,
    /// Blocks.
    pub layers: usize,
    /// The MLP's hidden width as a multiple of `d_model`.
    #[serde(default = "default_mlp_ratio")]
    pub mlp_ratio: usize,
    /// The layer-norm epsilon (BERT's is 1e-12).
    #[serde(default = "default_bert_eps")]
    pub norm_eps: f64,
    /// How attention scores are scaled.
    #[serde(default = "default_attention_scale")]
    pub attention_scale: AttentionScale,
    /// How attention ignores the padding.
    #[serde(default)]
    pub mask: MaskKind,
    /// The shortest sequence before padding; 0 lets a sample be padding
    /// only, so that its attention rows are fully masked.
    #[serde(default = "default_min_length")]
    pub min_length: usize,
    /// Output classes.
    pub classes: usize,
    /// How the weights are drawn.
    #[serde(default = "default_xavier")]
    pub init: InitSpec,
}

/// How attention ignores the padded keys.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum MaskKind {
    /// BERT's: `(1 - keep) · value` added to the logits, computed in the
    /// compute dtype (f32::MIN is -inf in f16, and 0 · -inf is NaN).
    Additive {
        /// The value added at a masked key.
        value: f64,
    },
    /// PyTorch's `masked_fill(-inf)`: a fully masked row is NaN after the softmax.
    NegInf,
}

impl Default for MaskKind {
    fn default() -> Self {
        MaskKind::Additive { value: -1e4 }
    }
}

fn default_bert_eps() -> f64 {
    1e-12
}

fn default_min_length() -> usize {
    1
}

/// A user's own model in a case. Built with [`CustomSpec::new`] and the
/// builder methods below (fields may be added: the struct is
/// `#[non_exhaustive]`), or by setting its public fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CustomSpec {
    /// The family name the user's model reports in signatures.
    pub name: String,
    /// What the model reads.
    pub input: InputSpec,
    /// Outputs per prediction.
    pub outputs: usize,
    /// The gain and scheme of the harness's init for the model's weights.
    #[serde(default)]
    pub init: InitSpec,
    /// The model predicts at every position of a sequence (a language
    /// model's own objective): it returns (batch, positions, outputs) and
    /// takes one label per position.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_token: bool,
    /// Tensors (or module prefixes: `embeddings` covers
    /// `embeddings.word.weight`) that are deliberately not trained: they
    /// need no gradient and the optimizer leaves them alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frozen: Vec<String>,
    /// Named numbers the model's factory reads ([`crate::models::Knobs`]):
    /// a norm eps, a mask value, a gain. `diagnose` proposes and verifies
    /// values in their range; `minimize` rounds them.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub knobs: std::collections::BTreeMap<String, KnobSpec>,
    /// Initializations that replace the model's own hints, by tensor name
    /// or module prefix (`{"vit.embeddings.cls_token": {"kind": "normal",
    /// "std": 0.02}}`); the longest matching key wins.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub init_overrides: std::collections::BTreeMap<String, InitOverride>,
}

impl CustomSpec {
    /// A user's model named `name` (its family in signatures), with the
    /// default init and nothing frozen, no knobs, no init overrides.
    pub fn new(name: impl Into<String>, input: InputSpec, outputs: usize) -> Self {
        CustomSpec {
            name: name.into(),
            input,
            outputs,
            init: InitSpec::default(),
            per_token: false,
            frozen: Vec::new(),
            knobs: Default::default(),
            init_overrides: Default::default(),
        }
    }

    /// The harness's init with this scheme and gain.
    pub fn with_init(mut self, init: InitSpec) -> Self {
        self.init = init;
        self
    }

    /// One prediction per position (a language model's own objective).
    pub fn per_token(mut self, per_token: bool) -> Self {
        self.per_token = per_token;
        self
    }

    /// Tensors (or module prefixes) deliberately not trained.
    pub fn frozen<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.frozen.extend(names.into_iter().map(Into::into));
        self
    }

    /// A named number the factory reads, with its range.
    pub fn knob(mut self, name: impl Into<String>, knob: KnobSpec) -> Self {
        self.knobs.insert(name.into(), knob);
        self
    }

    /// An initialization that replaces the model's own hint for `name`.
    pub fn init_override(mut self, name: impl Into<String>, init: InitOverride) -> Self {
        self.init_overrides.insert(name.into(), init);
        self
    }
}

/// How one tensor is initialized instead of its model's hint (absolute:
/// the init gain does not scale it).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum InitOverride {
    /// Drawn from N(0, std²).
    Normal {
        /// The standard deviation.
        std: f64,
    },
    /// Drawn from U(−bound, bound).
    Uniform {
        /// The half-width.
        bound: f64,
    },
    /// Every element `value`.
    Const {
        /// The value.
        value: f64,
    },
}

/// A declared model knob: its value and the range worth trying.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct KnobSpec {
    /// The value the model is built with.
    pub value: f64,
    /// The smallest value worth trying.
    pub min: f64,
    /// The largest value worth trying.
    pub max: f64,
    /// The stage (or stage prefix) the knob acts on, as the model records
    /// it (`attn.mask`): a finding there makes the knob the first suspect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
}

impl KnobSpec {
    /// A knob at `value` in `[min, max]`.
    pub fn new(value: f64, min: f64, max: f64) -> Self {
        KnobSpec {
            value,
            min,
            max,
            stage: None,
        }
    }

    /// The stage (or stage prefix) the knob acts on.
    pub fn at_stage(mut self, stage: impl Into<String>) -> Self {
        self.stage = Some(stage.into());
        self
    }

    /// The value at `u` in [0, 1] across the range: by magnitude when the
    /// range keeps one sign and spans over 100x, else evenly.
    pub fn at(&self, u: f64) -> f64 {
        let (lo, hi) = (self.min, self.max);
        let same_sign = (lo > 0.0 && hi > 0.0) || (lo < 0.0 && hi < 0.0);
        let (a, b) = (lo.abs().min(hi.abs()), lo.abs().max(hi.abs()));
        let v = if same_sign && b / a > 100.0 {
            lo.signum() * (a.ln() + u * (b.ln() - a.ln())).exp()
        } else {
            lo + u * (hi - lo)
        };
        v.clamp(lo, hi)
    }

    /// Values across the range, nearest the current value first: spaced by
    /// magnitude when the range keeps one sign and spans over 100x, else
    /// evenly; the current value left out.
    pub fn candidates(&self, n: usize) -> Vec<f64> {
        let (lo, hi) = (self.min, self.max);
        let same_sign = (lo > 0.0 && hi > 0.0) || (lo < 0.0 && hi < 0.0);
        let by_magnitude = same_sign && lo.abs().max(hi.abs()) / lo.abs().min(hi.abs()) > 100.0;
        let points: Vec<f64> = (0..n)
            .map(|i| self.at(i as f64 / (n - 1).max(1) as f64))
            .map(|v| {
                if by_magnitude {
                    super::round1(v).clamp(lo, hi)
                } else {
                    v
                }
            })
            .collect();
        let distance = |v: f64| {
            if same_sign {
                (v.abs().ln() - self.value.abs().ln()).abs()
            } else {
                (v - self.value).abs()
            }
        };
        let mut out: Vec<f64> = Vec::new();
        for p in points {
            if p != self.value && !out.contains(&p) {
                out.push(p);
            }
        }
        out.sort_by(|x, y| distance(*x).total_cmp(&distance(*y)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knob(value: f64, min: f64, max: f64) -> KnobSpec {
        KnobSpec {
            value,
            min,
            max,
            stage: None,
        }
    }

    #[test]
    fn knob_candidates_span_the_range_by_magnitude_nearest_first() {
        let mask = knob(f64::from(f32::MIN), f64::from(f32::MIN), -1e4);
        let c = mask.candidates(5);
        assert_eq!(c.len(), 5, "{c:?}");
        assert_eq!(*c.last().unwrap(), -1e4, "the far end comes last: {c:?}");
        assert!(c.iter().all(|v| (mask.min..=mask.max).contains(v)), "{c:?}");
        assert!(
            c.windows(2).all(|w| w[0] < w[1]),
            "nearest -3.4e38 first: {c:?}"
        );
        let eps = knob(1e-12, 1e-12, 1e-3);
        assert_eq!(eps.candidates(4), vec![1e-9, 1e-6, 1e-3]);
        // A range that crosses zero is spaced evenly.
        assert_eq!(
            knob(0.5, 0.0, 1.0).candidates(5),
            vec![0.25, 0.75, 0.0, 1.0]
        );
    }

    #[test]
    fn a_knob_outside_its_range_is_an_error_naming_it() {
        let mut case = crate::spec::Case::example("cnn").unwrap();
        let mut knobs = std::collections::BTreeMap::new();
        knobs.insert("ln_eps".to_string(), knob(1.0, 1e-12, 1e-3));
        case.model = ModelSpec::Custom(CustomSpec {
            name: "m".into(),
            input: InputSpec::Vector { features: 4 },
            outputs: 2,
            init: InitSpec::default(),
            per_token: false,
            frozen: Vec::new(),
            knobs,
            init_overrides: Default::default(),
        });
        let e = case.validate(&Default::default()).unwrap_err().to_string();
        assert!(
            e.contains("model.knobs.ln_eps") && e.contains("within"),
            "{e}"
        );
    }
}
