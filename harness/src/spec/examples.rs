//! The built-in default case of each family: small, stable and learnable.

use super::*;

/// The built-in families, in the order commands list them.
pub const FAMILIES: [&str; 5] = ["cnn", "transformer", "rnn", "decoder", "encoder"];

/// Model sizes of the built-in families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Size {
    /// Half the widths of the default: the fastest to run.
    Small,
    /// The family's example case.
    Default,
    /// The sizes of the side-by-side benchmark: CNN 3×32×32 with two
    /// conv+relu+maxpool blocks, Transformer seq 32 / d 64 / 4 heads /
    /// 2 layers, LSTM seq 32 / input 16 / hidden 64, decoder vocab 64 /
    /// seq 32 / d 64 / 4 heads over 2 key/value heads / 2 layers, encoder
    /// vocab 64 / seq 32 / d 64 / 4 heads / 2 layers, batch 32.
    Large,
}

impl Size {
    /// Every size, smallest first.
    pub const ALL: [Size; 3] = [Size::Small, Size::Default, Size::Large];

    /// The size's name (`small`, `default`, `large`).
    pub fn name(self) -> &'static str {
        match self {
            Size::Small => "small",
            Size::Default => "default",
            Size::Large => "large",
        }
    }
}

impl std::str::FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Size::ALL
            .into_iter()
            .find(|z| z.name() == s)
            .ok_or_else(|| format!("unknown size `{s}`: expected small, default or large"))
    }
}

/// PyTorch's default Adam at this learning rate: the examples' optimizer.
fn adam(lr: f64) -> OptimizerSpec {
    OptimizerSpec::Adam {
        lr,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    }
}

impl Case {
    /// A built-in family's case at a size (`None` for an unknown family).
    pub fn example_sized(family: &str, size: Size) -> Option<Case> {
        let mut case = Case::example(family)?;
        match (&mut case.model, size) {
            (_, Size::Default) => {}
            (ModelSpec::Cnn(c), Size::Small) => {
                (c.height, c.width) = (8, 8);
                c.blocks.iter_mut().for_each(|b| b.channels = 4);
            }
            (ModelSpec::Transformer(t), Size::Small) => {
                t.d_model = 8;
                t.seq_len = 4;
            }
            (ModelSpec::Rnn(r), Size::Small) => {
                r.hidden = 8;
                r.seq_len = 6;
            }
            (ModelSpec::Decoder(d), Size::Small) => {
                d.d_model = 8;
                d.seq_len = 4;
            }
            (ModelSpec::Encoder(e), Size::Small) => {
                e.d_model = 8;
                e.seq_len = 4;
            }
            (ModelSpec::Cnn(c), Size::Large) => {
                (c.height, c.width) = (32, 32);
                c.blocks = [16, 32]
                    .map(|channels| ConvBlockSpec {
                        channels,
                        kernel: 3,
                        batch_norm_eps: None,
                        activation: Activation::Relu,
                        residual: false,
                        pool: Pool::Max,
                    })
                    .to_vec();
            }
            (ModelSpec::Transformer(t), Size::Large) => {
                t.input = TokenOrContinuous::Tokens { vocab: 64 };
                (t.seq_len, t.d_model, t.heads, t.layers) = (32, 64, 4, 2);
            }
            (ModelSpec::Rnn(r), Size::Large) => {
                (r.seq_len, r.features, r.hidden) = (32, 16, 64);
            }
            (ModelSpec::Encoder(e), Size::Large) => {
                (e.vocab, e.seq_len, e.d_model, e.heads, e.layers) = (64, 32, 64, 4, 2);
            }
            (ModelSpec::Decoder(d), Size::Large) => {
                (d.vocab, d.seq_len, d.d_model, d.heads, d.kv_heads, d.layers) =
                    (64, 32, 64, 4, 2, 2);
            }
            (ModelSpec::Custom(_), _) => return None,
        }
        if size == Size::Large {
            case.batch_size = 32;
        }
        Some(case)
    }

    /// The default case of a built-in family (`None` for an unknown name).
    pub fn example(family: &str) -> Option<Case> {
        let (model, optimizer) = match family {
            "cnn" => (
                ModelSpec::Cnn(CnnSpec {
                    channels: 3,
                    height: 16,
                    width: 16,
                    classes: 4,
                    blocks: vec![
                        ConvBlockSpec {
                            channels: 8,
                            kernel: 3,
                            batch_norm_eps: Some(1e-5),
                            activation: Activation::Relu,
                            residual: false,
                            pool: Pool::Max,
                        },
                        ConvBlockSpec {
                            channels: 8,
                            kernel: 3,
                            batch_norm_eps: None,
                            activation: Activation::Relu,
                            residual: true,
                            pool: Pool::Avg,
                        },
                    ],
                    init: InitSpec::default(),
                }),
                adam(3e-3),
            ),
            "transformer" => (
                ModelSpec::Transformer(TransformerSpec {
                    input: TokenOrContinuous::Tokens { vocab: 16 },
                    seq_len: 8,
                    d_model: 16,
                    heads: 2,
                    layers: 1,
                    mlp_ratio: 2,
                    norm: NormPlacement::Pre,
                    norm_eps: 1e-5,
                    attention_scale: AttentionScale::InvSqrtD,
                    causal: false,
                    head: HeadKind::Classify,
                    classes: 4,
                    init: InitSpec {
                        scheme: InitScheme::Xavier,
                        gain: 1.0,
                    },
                }),
                adam(3e-3),
            ),
            "rnn" => (
                ModelSpec::Rnn(RnnSpec {
                    cell: CellKind::Lstm,
                    features: 4,
                    seq_len: 12,
                    hidden: 16,
                    layers: 1,
                    classes: 4,
                    init: InitSpec {
                        scheme: InitScheme::Xavier,
                        gain: 1.0,
                    },
                }),
                adam(1e-2),
            ),
            "decoder" => (
                ModelSpec::Decoder(DecoderSpec {
                    vocab: 16,
                    seq_len: 8,
                    d_model: 16,
                    heads: 2,
                    kv_heads: 1,
                    layers: 1,
                    mlp_ratio: 2,
                    rms_eps: 1e-5,
                    rope_theta: 10_000.0,
                    attention_scale: AttentionScale::InvSqrtD,
                    init: InitSpec {
                        scheme: InitScheme::Xavier,
                        gain: 1.0,
                    },
                }),
                adam(3e-3),
            ),
            "encoder" => (
                ModelSpec::Encoder(EncoderSpec {
                    vocab: 16,
                    seq_len: 8,
                    d_model: 16,
                    heads: 2,
                    layers: 1,
                    mlp_ratio: 2,
                    norm_eps: 1e-12,
                    attention_scale: AttentionScale::InvSqrtD,
                    mask: MaskKind::default(),
                    min_length: 2,
                    classes: 4,
                    init: InitSpec {
                        scheme: InitScheme::Xavier,
                        gain: 1.0,
                    },
                }),
                adam(3e-3),
            ),
            _ => return None,
        };
        Some(Case {
            format: FORMAT_VERSION,
            seed: 0,
            device: DeviceSpec::Cpu,
            precision: Precision::F32,
            steps: 50,
            batch_size: 16,
            model,
            data: DataSpec::default(),
            augment: Vec::new(),
            loss: LossSpec::CrossEntropy {
                label_smoothing: 0.0,
            },
            optimizer,
            schedule: ScheduleSpec::Constant,
            clip: ClipSpec::None,
            divergence_factor: 4.0,
        })
    }
}
