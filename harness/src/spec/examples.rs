//! The built-in default case of each family: small, stable and learnable.

use super::*;

/// The built-in families, in the order commands list them.
pub const FAMILIES: [&str; 3] = ["cnn", "transformer", "rnn"];

impl Case {
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
                OptimizerSpec::Adam {
                    lr: 3e-3,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay: 0.0,
                },
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
                OptimizerSpec::Adam {
                    lr: 3e-3,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay: 0.0,
                },
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
                OptimizerSpec::Adam {
                    lr: 1e-2,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay: 0.0,
                },
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
