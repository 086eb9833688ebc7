//! `Case::validate`: rejects impossible or oversized cases, naming the field.

use super::*;
use crate::error::{Error, Result};

/// Size limits a case must stay under (configurable per command).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Limits {
    /// The most trainable parameters.
    pub max_params: usize,
    /// The most training steps.
    pub max_steps: usize,
    /// The largest batch.
    pub max_batch: usize,
    /// Estimated peak bytes of parameters, optimizer state and activations.
    pub max_memory_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_params: 20_000_000,
            max_steps: 100_000,
            max_batch: 4096,
            max_memory_bytes: 4 << 30,
        }
    }
}

impl Limits {
    /// With this many steps at most.
    pub fn max_steps(mut self, steps: usize) -> Self {
        self.max_steps = steps;
        self
    }

    /// With this many parameters at most.
    pub fn max_params(mut self, params: usize) -> Self {
        self.max_params = params;
        self
    }

    /// With this batch size at most.
    pub fn max_batch(mut self, batch: usize) -> Self {
        self.max_batch = batch;
        self
    }

    /// With this estimated peak memory at most.
    pub fn max_memory_bytes(mut self, bytes: usize) -> Self {
        self.max_memory_bytes = bytes;
        self
    }
}

type Check = Result<()>;

fn finite(field: &str, v: f64) -> Check {
    if v.is_finite() {
        Ok(())
    } else {
        Err(Error::invalid(field, format!("must be finite, got {v}")))
    }
}

fn in_range(field: &str, v: f64, lo: f64, hi: f64) -> Check {
    finite(field, v)?;
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("must be in [{lo}, {hi}], got {v}"),
        ))
    }
}

fn non_negative(field: &str, v: f64) -> Check {
    finite(field, v)?;
    if v >= 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(field, format!("must be >= 0, got {v}")))
    }
}

fn positive(field: &str, v: f64) -> Check {
    finite(field, v)?;
    if v > 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(field, format!("must be > 0, got {v}")))
    }
}

fn count(field: &str, v: usize, lo: usize, hi: usize) -> Check {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("must be between {lo} and {hi}, got {v}"),
        ))
    }
}

fn fraction(field: &str, v: f64) -> Check {
    finite(field, v)?;
    if v > 0.0 && v <= 1.0 {
        Ok(())
    } else {
        Err(Error::invalid(field, format!("must be in (0, 1], got {v}")))
    }
}

fn interval(field: &str, r: [f64; 2], lo: f64, hi: f64) -> Check {
    in_range(&format!("{field}[0]"), r[0], lo, hi)?;
    in_range(&format!("{field}[1]"), r[1], lo, hi)?;
    if r[0] <= r[1] {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("lower bound {} exceeds upper bound {}", r[0], r[1]),
        ))
    }
}

impl Case {
    /// Checks that the case can run as written and fits `limits`.
    pub fn validate(&self, limits: &Limits) -> Result<()> {
        count("steps", self.steps, 1, limits.max_steps)?;
        count("batch_size", self.batch_size, 1, limits.max_batch)?;
        in_range("divergence_factor", self.divergence_factor, 1.0001, 1e12)?;
        self.validate_model()?;
        self.validate_data()?;
        self.validate_augment()?;
        self.validate_loss()?;
        self.validate_optimizer()?;
        self.validate_precision()?;

        let params = self.model.param_count();
        if params > limits.max_params {
            return Err(Error::invalid(
                "model",
                format!(
                    "{params} parameters exceed the limit of {}",
                    limits.max_params
                ),
            ));
        }
        let memory = self.memory_estimate();
        if memory > limits.max_memory_bytes as u128 {
            return Err(Error::invalid(
                "model",
                format!(
                    "estimated memory {} MiB exceeds the limit of {} MiB",
                    memory >> 20,
                    limits.max_memory_bytes >> 20
                ),
            ));
        }
        Ok(())
    }

    fn validate_model(&self) -> Check {
        let init = self.model.init();
        non_negative("model.init.gain", init.gain)?;
        match &self.model {
            ModelSpec::Cnn(c) => {
                count("model.channels", c.channels, 1, 64)?;
                count("model.height", c.height, 1, 512)?;
                count("model.width", c.width, 1, 512)?;
                count("model.classes", c.classes, 1, 1000)?;
                count("model.blocks", c.blocks.len(), 1, 6)?;
                let (mut ch, mut h, mut w) = (c.channels, c.height, c.width);
                for (i, b) in c.blocks.iter().enumerate() {
                    let f = |name: &str| format!("model.blocks[{i}].{name}");
                    count(&f("channels"), b.channels, 1, 1024)?;
                    count(&f("kernel"), b.kernel, 1, 7)?;
                    if b.kernel % 2 == 0 {
                        return Err(Error::invalid(
                            f("kernel"),
                            format!("must be odd (same padding), got {}", b.kernel),
                        ));
                    }
                    if let Some(eps) = b.batch_norm_eps {
                        non_negative(&f("batch_norm_eps"), eps)?;
                    }
                    if b.residual && b.channels != ch {
                        return Err(Error::invalid(
                            f("residual"),
                            format!(
                                "a residual block needs equal input and output channels, got {ch} -> {}",
                                b.channels
                            ),
                        ));
                    }
                    if b.pool != Pool::None {
                        if h < 2 || w < 2 {
                            return Err(Error::invalid(
                                f("pool"),
                                format!(
                                    "2x2 pooling needs a feature map of at least 2x2, got {h}x{w}"
                                ),
                            ));
                        }
                        h /= 2;
                        w /= 2;
                    }
                    ch = b.channels;
                }
            }
            ModelSpec::Transformer(t) => {
                count("model.seq_len", t.seq_len, 1, 4096)?;
                count("model.d_model", t.d_model, 1, 4096)?;
                count("model.heads", t.heads, 1, 64)?;
                count("model.layers", t.layers, 1, 48)?;
                count("model.mlp_ratio", t.mlp_ratio, 1, 8)?;
                count("model.classes", t.classes, 1, 100_000)?;
                non_negative("model.norm_eps", t.norm_eps)?;
                if t.d_model % t.heads != 0 {
                    return Err(Error::invalid(
                        "model.heads",
                        format!(
                            "d_model {} is not divisible by heads {}",
                            t.d_model, t.heads
                        ),
                    ));
                }
                match t.input {
                    TokenOrContinuous::Tokens { vocab } => {
                        count("model.input.vocab", vocab, 2, 1_000_000)?
                    }
                    TokenOrContinuous::Continuous { features } => {
                        count("model.input.features", features, 1, 65_536)?
                    }
                }
            }
            ModelSpec::Decoder(d) => {
                count("model.vocab", d.vocab, 2, 1_000_000)?;
                count("model.seq_len", d.seq_len, 1, 4096)?;
                count("model.d_model", d.d_model, 2, 4096)?;
                count("model.heads", d.heads, 1, 64)?;
                count("model.kv_heads", d.kv_heads, 1, 64)?;
                count("model.layers", d.layers, 1, 48)?;
                count("model.mlp_ratio", d.mlp_ratio, 1, 8)?;
                non_negative("model.rms_eps", d.rms_eps)?;
                if !(d.rope_theta.is_finite() && d.rope_theta > 1.0) {
                    return Err(Error::invalid(
                        "model.rope_theta",
                        format!("must be finite and above 1, got {}", d.rope_theta),
                    ));
                }
                if d.d_model % d.heads != 0 || (d.d_model / d.heads) % 2 != 0 {
                    return Err(Error::invalid(
                        "model.heads",
                        format!(
                            "d_model {} must split into {} heads of an even width (rotary pairs)",
                            d.d_model, d.heads
                        ),
                    ));
                }
                if d.heads % d.kv_heads != 0 {
                    return Err(Error::invalid(
                        "model.kv_heads",
                        format!(
                            "must divide heads {} (each key/value head serves a group of query heads), got {}",
                            d.heads, d.kv_heads
                        ),
                    ));
                }
            }
            ModelSpec::Encoder(e) => {
                count("model.vocab", e.vocab, 2, 1_000_000)?;
                count("model.seq_len", e.seq_len, 1, 4096)?;
                count("model.d_model", e.d_model, 1, 4096)?;
                count("model.heads", e.heads, 1, 64)?;
                count("model.layers", e.layers, 1, 48)?;
                count("model.mlp_ratio", e.mlp_ratio, 1, 8)?;
                count("model.classes", e.classes, 1, 100_000)?;
                non_negative("model.norm_eps", e.norm_eps)?;
                if e.d_model % e.heads != 0 {
                    return Err(Error::invalid(
                        "model.heads",
                        format!(
                            "d_model {} is not divisible by heads {}",
                            e.d_model, e.heads
                        ),
                    ));
                }
                if e.min_length > e.seq_len {
                    return Err(Error::invalid(
                        "model.min_length",
                        format!(
                            "must be at most seq_len {}, got {}",
                            e.seq_len, e.min_length
                        ),
                    ));
                }
                if let MaskKind::Additive { value } = e.mask {
                    if !(value.is_finite() && value < 0.0) {
                        return Err(Error::invalid(
                            "model.mask.value",
                            format!("must be finite and negative, got {value}"),
                        ));
                    }
                }
            }
            ModelSpec::Rnn(r) => {
                count("model.features", r.features, 1, 65_536)?;
                count("model.seq_len", r.seq_len, 1, 4096)?;
                count("model.hidden", r.hidden, 1, 8192)?;
                count("model.layers", r.layers, 1, 8)?;
                count("model.classes", r.classes, 1, 100_000)?;
            }
            ModelSpec::Custom(c) => {
                if c.name.is_empty()
                    || !c
                        .name
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
                {
                    return Err(Error::invalid(
                        "model.name",
                        format!(
                            "must be a non-empty name of letters, digits, '_' or '-', got {:?}",
                            c.name
                        ),
                    ));
                }
                count("model.outputs", c.outputs, 1, 100_000)?;
                if c.per_token
                    && !matches!(
                        c.input,
                        InputSpec::Tokens { .. } | InputSpec::Sequence { .. }
                    )
                {
                    return Err(Error::invalid(
                        "model.per_token",
                        "one prediction per position needs a sequence input (tokens or sequence)",
                    ));
                }
                for (i, d) in c.input.dims().iter().enumerate() {
                    count(&format!("model.input.dims[{i}]"), *d, 1, 65_536)?;
                }
                if let InputSpec::Tokens { vocab, .. } = c.input {
                    count("model.input.vocab", vocab, 2, 1_000_000)?;
                }
                for (name, o) in &c.init_overrides {
                    let field = format!("model.init_overrides.{name}");
                    let (what, v) = match *o {
                        InitOverride::Normal { std } => ("std", std),
                        InitOverride::Uniform { bound } => ("bound", bound),
                        InitOverride::Const { value } => ("value", value),
                    };
                    let ok = v.is_finite() && (what == "value" || v >= 0.0);
                    if !ok {
                        return Err(Error::invalid(
                            &field,
                            format!(
                                "`{what}` must be finite{}, got {v}",
                                if what == "value" { "" } else { " and >= 0" }
                            ),
                        ));
                    }
                }
                for (name, k) in &c.knobs {
                    let field = format!("model.knobs.{name}");
                    if name.is_empty()
                        || !name
                            .chars()
                            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '_' | '-' | '.'))
                    {
                        return Err(Error::invalid(
                            "model.knobs",
                            format!("a knob name must be letters, digits, '_', '-' or '.', got {name:?}"),
                        ));
                    }
                    if !(k.min.is_finite() && k.max.is_finite() && k.min < k.max) {
                        return Err(Error::invalid(
                            &field,
                            format!(
                                "`min` and `max` must be finite with min < max, got {:e} and {:e}",
                                k.min, k.max
                            ),
                        ));
                    }
                    if !(k.value.is_finite() && (k.min..=k.max).contains(&k.value)) {
                        return Err(Error::invalid(
                            &field,
                            format!(
                                "`value` must be finite and within [{:e}, {:e}], got {:e}",
                                k.min, k.max, k.value
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn feature_count(&self) -> Option<usize> {
        match self.model.input() {
            InputSpec::Image { channels, .. } => Some(channels),
            InputSpec::Sequence { features, .. } | InputSpec::Vector { features } => Some(features),
            InputSpec::Tokens { .. } => None,
        }
    }

    fn validate_source(&self) -> Check {
        let d = &self.data;
        let synthetic = DataSpec::default();
        if d.source.is_synthetic() {
            return Ok(());
        }
        // A dataset's real inputs are rescaled (`x * scale + offset`, the
        // next dataset's units); token ids are not.
        let rescaled = d.scale != synthetic.scale || d.offset != synthetic.offset;
        if rescaled && self.model.input().is_tokens() {
            return Err(Error::invalid(
                "data.scale",
                "rescales real inputs only; this model reads token ids",
            ));
        }
        // The generator's other knobs would silently do nothing to a dataset.
        for (field, set) in [
            ("data.noise", d.noise != synthetic.noise),
            (
                "data.distribution",
                d.distribution != synthetic.distribution,
            ),
        ] {
            if set {
                return Err(Error::invalid(
                    field,
                    "shapes synthetic data only; a dataset's values are its own (scale, offset, pathologies and augmentations still apply)",
                ));
            }
        }
        if let SourceSpec::File(f) = &d.source {
            if f.path.as_os_str().is_empty() {
                return Err(Error::invalid("data.source.path", "name the dataset file"));
            }
            if let Some(h) = &f.sha256 {
                if h.len() != 64 || !h.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(Error::invalid(
                        "data.source.sha256",
                        format!("`{h}` is not a SHA-256 (64 hex digits)"),
                    ));
                }
            }
        }
        if let Some(s) = d.source.sampling() {
            if s.indices.as_ref().is_some_and(Vec::is_empty) {
                return Err(Error::invalid(
                    "data.source.sampling.indices",
                    "name at least one sample (or leave `indices` out to draw them all)",
                ));
            }
        }
        Ok(())
    }

    fn validate_data(&self) -> Check {
        let d = &self.data;
        in_range("data.scale", d.scale, -1e30, 1e30)?;
        in_range("data.offset", d.offset, -1e30, 1e30)?;
        in_range("data.noise", d.noise, 0.0, 1e6)?;
        self.validate_source()?;
        let tokens = self.model.input().is_tokens();
        for (i, p) in d.pathologies.iter().enumerate() {
            let field = format!("data.pathologies[{i}]");
            if let Some(fr) = p.fraction() {
                fraction(&format!("{field}.fraction"), fr)?;
            }
            let is_label = matches!(p, Pathology::LabelOutOfRange { .. });
            if tokens && !is_label {
                return Err(Error::invalid(
                    field,
                    format!(
                        "`{}` corrupts real-valued inputs, but this model reads token ids",
                        p.name()
                    ),
                ));
            }
            match p {
                Pathology::Extreme { magnitude, .. } => {
                    in_range(&format!("{field}.magnitude"), *magnitude, 1.0, 1e30)?
                }
                Pathology::ConstantFeature { feature, value, .. } => {
                    finite(&format!("{field}.value"), *value)?;
                    let n = self.feature_count().unwrap_or(0);
                    if *feature >= n {
                        return Err(Error::invalid(
                            format!("{field}.feature"),
                            format!("feature {feature} does not exist: the input has {n}"),
                        ));
                    }
                }
                Pathology::LabelOutOfRange { offset, .. } => {
                    if self.loss.target_kind() != TargetKind::Labels {
                        return Err(Error::invalid(
                            field,
                            format!(
                                "label_out_of_range needs a loss on class labels, but `{}` uses other targets",
                                self.loss.name()
                            ),
                        ));
                    }
                    count(&format!("{field}.offset"), *offset, 0, 1_000_000)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn validate_augment(&self) -> Check {
        let input = self.model.input();
        for (i, a) in self.augment.iter().enumerate() {
            let field = format!("augment[{i}]");
            let f = |name: &str| format!("{field}.{name}");
            if input.is_tokens() {
                return Err(Error::invalid(
                    field,
                    format!(
                        "`{}` needs real-valued inputs, but this model reads token ids",
                        a.name()
                    ),
                ));
            }
            if a.image_only() && !matches!(input, InputSpec::Image { .. }) {
                return Err(Error::invalid(
                    field,
                    format!("`{}` needs image inputs", a.name()),
                ));
            }
            match a {
                Augment::RandomErasing {
                    p,
                    scale,
                    ratio,
                    value,
                } => {
                    in_range(&f("p"), *p, 0.0, 1.0)?;
                    interval(&f("scale"), *scale, 0.0, 1.0)?;
                    interval(&f("ratio"), *ratio, 1e-3, 1e3)?;
                    finite(&f("value"), *value)?;
                }
                Augment::ColorJitter {
                    brightness,
                    contrast,
                    saturation,
                    hue,
                } => {
                    in_range(&f("brightness"), *brightness, 0.0, 100.0)?;
                    in_range(&f("contrast"), *contrast, 0.0, 100.0)?;
                    in_range(&f("saturation"), *saturation, 0.0, 100.0)?;
                    in_range(&f("hue"), *hue, 0.0, 0.5)?;
                }
                Augment::RandomAffine {
                    degrees,
                    translate,
                    scale,
                    shear,
                } => {
                    in_range(&f("degrees"), *degrees, 0.0, 180.0)?;
                    interval(&f("translate"), *translate, 0.0, 1.0)?;
                    interval(&f("scale"), *scale, 1e-3, 100.0)?;
                    in_range(&f("shear"), *shear, 0.0, 89.0)?;
                }
                Augment::GaussianNoise { std } => in_range(&f("std"), *std, 0.0, 1e30)?,
                Augment::Mixup { alpha } => in_range(&f("alpha"), *alpha, 1e-3, 1e3)?,
                Augment::Normalize(NormalizeSpec::PerChannel { mean, std }) => {
                    let n = self.feature_count().unwrap_or(0);
                    for (name, v) in [("mean", mean), ("std", std)] {
                        if v.len() != n {
                            return Err(Error::invalid(
                                f(name),
                                format!("needs one value per channel ({n}), got {}", v.len()),
                            ));
                        }
                    }
                    for (j, m) in mean.iter().enumerate() {
                        finite(&f(&format!("mean[{j}]")), *m)?;
                    }
                    for (j, s) in std.iter().enumerate() {
                        non_negative(&f(&format!("std[{j}]")), *s)?;
                    }
                }
                Augment::Normalize(NormalizeSpec::PerSample { eps }) => {
                    non_negative(&f("eps"), *eps)?
                }
                Augment::TimeMask {
                    p,
                    max_width,
                    value,
                } => {
                    if !matches!(input, InputSpec::Sequence { .. }) {
                        return Err(Error::invalid(field, "`time_mask` needs sequence inputs"));
                    }
                    in_range(&f("p"), *p, 0.0, 1.0)?;
                    count(&f("max_width"), *max_width, 1, 65_536)?;
                    finite(&f("value"), *value)?;
                }
            }
        }
        Ok(())
    }

    fn validate_loss(&self) -> Check {
        match &self.loss {
            LossSpec::CrossEntropy { label_smoothing } => {
                in_range("loss.label_smoothing", *label_smoothing, 0.0, 0.999)?
            }
            LossSpec::NaiveCrossEntropy { eps } => in_range("loss.eps", *eps, 0.0, 1.0)?,
            LossSpec::Mse { eps, .. } => non_negative("loss.eps", *eps)?,
            LossSpec::Huber { delta } => positive("loss.delta", *delta)?,
            LossSpec::Bce { eps } | LossSpec::KlDiv { eps } | LossSpec::LogOneMinus { eps } => {
                in_range("loss.eps", *eps, 0.0, 0.5)?
            }
            LossSpec::PoissonNll { eps, .. } => non_negative("loss.eps", *eps)?,
            LossSpec::Nll | LossSpec::BceWithLogits => {}
            LossSpec::Custom { name, .. } => {
                if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(Error::invalid(
                        "loss.name",
                        format!("must be a non-empty name of letters, digits or '_', got {name:?}"),
                    ));
                }
            }
        }
        if self.loss.target_kind() == TargetKind::Labels && self.model.classes() < 2 {
            return Err(Error::invalid(
                "model.classes",
                format!(
                    "`{}` needs at least 2 classes, got {}",
                    self.loss.name(),
                    self.model.classes()
                ),
            ));
        }
        Ok(())
    }

    fn validate_optimizer(&self) -> Check {
        let o = &self.optimizer;
        non_negative("optimizer.lr", o.lr())?;
        match *o {
            OptimizerSpec::Sgd {
                momentum,
                nesterov,
                weight_decay,
                ..
            } => {
                in_range("optimizer.momentum", momentum, 0.0, 0.9999)?;
                non_negative("optimizer.weight_decay", weight_decay)?;
                if nesterov && momentum == 0.0 {
                    return Err(Error::invalid(
                        "optimizer.nesterov",
                        "Nesterov momentum needs momentum > 0",
                    ));
                }
            }
            OptimizerSpec::Adam {
                beta1,
                beta2,
                eps,
                weight_decay,
                ..
            }
            | OptimizerSpec::Adamw {
                beta1,
                beta2,
                eps,
                weight_decay,
                ..
            } => {
                in_range("optimizer.beta1", beta1, 0.0, 0.9999)?;
                in_range("optimizer.beta2", beta2, 0.0, 0.999_999)?;
                non_negative("optimizer.eps", eps)?;
                non_negative("optimizer.weight_decay", weight_decay)?;
            }
            OptimizerSpec::Rmsprop {
                alpha,
                eps,
                momentum,
                weight_decay,
                ..
            } => {
                in_range("optimizer.alpha", alpha, 0.0, 0.999_999)?;
                non_negative("optimizer.eps", eps)?;
                in_range("optimizer.momentum", momentum, 0.0, 0.9999)?;
                non_negative("optimizer.weight_decay", weight_decay)?;
            }
        }
        match self.schedule {
            ScheduleSpec::Constant => {}
            ScheduleSpec::Warmup { warmup_steps } => {
                count("schedule.warmup_steps", warmup_steps, 1, usize::MAX)?
            }
            ScheduleSpec::Cosine { min_factor, .. } => {
                in_range("schedule.min_factor", min_factor, 0.0, 1.0)?
            }
            ScheduleSpec::Step { step_size, gamma } => {
                count("schedule.step_size", step_size, 1, usize::MAX)?;
                in_range("schedule.gamma", gamma, 1e-6, 1e6)?;
            }
        }
        match self.clip {
            ClipSpec::None => {}
            ClipSpec::Norm { max_norm } => positive("clip.max_norm", max_norm)?,
            ClipSpec::Value { value } => positive("clip.value", value)?,
        }
        Ok(())
    }

    fn validate_precision(&self) -> Check {
        // candle 0.11's CPU convolution runs its matmul in the compute dtype,
        // and the CPU matmul has no bf16 kernel for it.
        if matches!(self.model, ModelSpec::Cnn(_))
            && self.device == DeviceSpec::Cpu
            && self.precision.compute_dtype() == candle_core::DType::BF16
        {
            return Err(Error::invalid(
                "precision",
                "bf16 convolutions are not supported on CPU by candle 0.11 (use f16, or run on CUDA)",
            ));
        }
        if let Some(scaling) = self.precision.loss_scaling() {
            match *scaling {
                LossScaling::None => {}
                LossScaling::Static { scale } => {
                    in_range("precision.loss_scaling.scale", scale, 1e-30, 1e30)?
                }
                LossScaling::Dynamic {
                    init,
                    growth_interval,
                    floor,
                } => {
                    in_range("precision.loss_scaling.init", init, 1e-30, 1e30)?;
                    count(
                        "precision.loss_scaling.growth_interval",
                        growth_interval,
                        1,
                        usize::MAX,
                    )?;
                    in_range("precision.loss_scaling.floor", floor, 1e-30, init)?;
                }
            }
        }
        Ok(())
    }

    /// A rough upper estimate of peak memory in bytes: parameters with
    /// gradients and two optimizer moments, saved activations of one batch,
    /// and the batch itself (generated, augmented, on the device, and its
    /// targets). In u128, where no valid or invalid size overflows.
    pub fn memory_estimate(&self) -> u128 {
        /// Copies of the batch alive at once: the host values, the device
        /// tensor, an augmented copy and the probe's view of it.
        const BATCH_COPIES: u128 = 4;
        let bytes = self.precision.master_dtype().size_in_bytes().max(4) as u128;
        let batch = self.batch_size as u128;
        let params = self.model.param_count() as u128 * bytes * 4;
        let activations = batch * self.model.activation_count() as u128 * bytes * 4;
        let rows = match &self.model {
            ModelSpec::Transformer(t) if self.model.per_token() => t.seq_len,
            _ => 1,
        };
        let targets = rows as u128 * self.model.classes() as u128;
        let sample = self.model.input().numel() as u128 + targets;
        params + activations + batch * sample * bytes * BATCH_COPIES
    }
}

impl ModelSpec {
    /// Number of trainable scalars; the built models are tested to agree.
    pub fn param_count(&self) -> usize {
        let linear = |i: usize, o: usize| i * o + o;
        match self {
            ModelSpec::Cnn(c) => {
                let mut ch = c.channels;
                let mut n = 0;
                for b in &c.blocks {
                    n += linear(ch * b.kernel * b.kernel, b.channels);
                    if b.batch_norm_eps.is_some() {
                        n += 2 * b.channels;
                    }
                    ch = b.channels;
                }
                n + linear(ch, c.classes)
            }
            ModelSpec::Transformer(t) => {
                let d = t.d_model;
                let embed = match t.input {
                    TokenOrContinuous::Tokens { vocab } => vocab * d,
                    TokenOrContinuous::Continuous { features } => linear(features, d),
                };
                let norms = if t.norm == NormPlacement::None {
                    0
                } else {
                    4 * d
                };
                let layer = 4 * linear(d, d)
                    + linear(d, t.mlp_ratio * d)
                    + linear(t.mlp_ratio * d, d)
                    + norms;
                let final_norm = if t.norm == NormPlacement::Pre {
                    2 * d
                } else {
                    0
                };
                embed + t.seq_len * d + t.layers * layer + final_norm + linear(d, t.classes)
            }
            ModelSpec::Rnn(r) => {
                let gates = match r.cell {
                    CellKind::Rnn => 1,
                    CellKind::Lstm => 4,
                    CellKind::Gru => 3,
                };
                let h = r.hidden;
                (0..r.layers)
                    .map(|l| {
                        let input = if l == 0 { r.features } else { h };
                        linear(input, gates * h) + linear(h, gates * h)
                    })
                    .sum::<usize>()
                    + linear(h, r.classes)
            }
            ModelSpec::Decoder(m) => {
                let d = m.d_model;
                let kv = m.kv_heads * (d / m.heads);
                let hidden = m.mlp_ratio * d;
                let block = 2 * d
                    + 2 * linear(d, d)
                    + 2 * linear(d, kv)
                    + 2 * linear(d, hidden)
                    + linear(hidden, d);
                m.vocab * d + m.layers * block + d + linear(d, m.vocab)
            }
            ModelSpec::Encoder(e) => {
                let d = e.d_model;
                let block = 4 * linear(d, d)
                    + linear(d, e.mlp_ratio * d)
                    + linear(e.mlp_ratio * d, d)
                    + 4 * d;
                (e.vocab + e.seq_len) * d + 2 * d + e.layers * block + linear(d, e.classes)
            }
            // Unknown until the user's code builds it; checked after building.
            ModelSpec::Custom(_) => 0,
        }
    }

    /// Activations per sample (for the memory estimate only).
    pub fn activation_count(&self) -> usize {
        match self {
            ModelSpec::Cnn(c) => {
                let (mut h, mut w) = (c.height, c.width);
                let mut n = 0;
                for b in &c.blocks {
                    n += 4 * b.channels * h * w;
                    if b.pool != Pool::None {
                        h /= 2;
                        w /= 2;
                    }
                }
                n
            }
            ModelSpec::Transformer(t) => {
                let s = t.seq_len;
                t.layers * (s * t.d_model * (10 + 2 * t.mlp_ratio) + 3 * t.heads * s * s)
            }
            ModelSpec::Rnn(r) => r.layers * r.seq_len * r.hidden * 12,
            ModelSpec::Decoder(m) => {
                let s = m.seq_len;
                m.layers * (s * m.d_model * (14 + 3 * m.mlp_ratio) + 3 * m.heads * s * s)
                    + s * m.vocab
            }
            ModelSpec::Encoder(e) => {
                let s = e.seq_len;
                e.layers * (s * e.d_model * (10 + 2 * e.mlp_ratio) + 4 * e.heads * s * s)
            }
            ModelSpec::Custom(c) => 16 * c.input.numel(),
        }
    }
}
