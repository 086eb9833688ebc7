//! The op that stops a backward pass. When candle's `backward` fails
//! because an op of the graph has none (a max-pool whose kernel is larger
//! than its stride, bilinear or non-integer upsampling, a custom op
//! without `bwd`), the runner reports a `no_gradient` finding with the op
//! (read from candle's error, the one place candle names it) and a
//! replacement. Which module calls the op is known only from traced
//! stages (the first whose own output cannot be differentiated holds it,
//! [`crate::checks::unsupported_backward_in`]): candle 0.11 keeps a
//! tensor's graph private (`Tensor::op` is crate-internal), and a backward
//! pass that fails leaves no gradient to locate it by.

/// An op without a backward pass, where the model uses it.
#[derive(Clone, Debug, PartialEq)]
pub struct Unsupported {
    /// The op as candle's error names it (`max_pool2d with kernel (3, 3)
    /// and stride (2, 2)`).
    pub op: String,
    /// A differentiable way to compute the same.
    pub replacement: String,
}

/// The `(a, b)` pairs of candle's message, in order.
fn pairs(message: &str) -> Vec<String> {
    message
        .split('(')
        .skip(1)
        .filter_map(|p| p.split_once(')').map(|(inside, _)| format!("({inside})")))
        .collect()
}

/// The unsupported op behind `error`, a failed `backward()`; `None` when
/// the error is not a missing backward.
pub fn unsupported(error: &candle_core::Error) -> Option<Unsupported> {
    let message = error.to_string();
    let op_and_replacement = if let Some(kind) = ["maxpool2d", "avgpool2d"]
        .into_iter()
        .find(|k| message.contains(&format!("backward not supported for {k}")))
    {
        let p = pairs(&message);
        let name = if kind == "maxpool2d" {
            "max_pool2d"
        } else {
            "avg_pool2d"
        };
        let (kernel, stride) = match &p[..] {
            [k, s, ..] => (k.as_str(), s.as_str()),
            _ => ("?", "?"),
        };
        (
            format!("{name} with kernel {kernel} and stride {stride}"),
            format!("the {} over the kernel's shifted views of the input, each subsampled by the stride (`narrow`, `reshape` and `maximum` have backward passes), or a pool whose kernel equals its stride",
                if kind == "maxpool2d" { "maximum" } else { "mean" }),
        )
    } else if message.contains("backward not supported for upsample_bilinear2d") {
        (
            "upsample_bilinear2d".into(),
            "upsample_nearest2d by an integer factor and a fixed averaging convolution, or a transposed convolution".into(),
        )
    } else if message.contains("backward not supported for non") && message.contains("upscaling") {
        (
            "upsample_nearest with a non-integer or non-uniform factor".into(),
            "an integer, uniform upscaling factor (then nearest upsampling has a backward pass)"
                .into(),
        )
    } else if let Some(op) = message.strip_prefix("backward is not supported for ") {
        let op = op.trim();
        (
            format!("`{op}`"),
            format!("implement `bwd` for `{op}`, or compute it from candle ops that have one"),
        )
    } else {
        return None;
    };
    let (op, replacement) = op_and_replacement;
    Some(Unsupported { op, replacement })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Tensor, Var};

    #[test]
    fn an_overlapping_max_pool_is_named_from_candles_error() {
        let w = Var::from_tensor(&Tensor::ones((1, 1, 3, 3), DType::F32, &Device::Cpu).unwrap())
            .unwrap();
        let x = Tensor::ones((1, 1, 8, 8), DType::F32, &Device::Cpu).unwrap();
        let y = x.conv2d(w.as_tensor(), 1, 1, 1, 1).unwrap();
        let loss = y.max_pool2d_with_stride(3, 2).unwrap().sum_all().unwrap();
        let err = loss.backward().unwrap_err();
        let u = unsupported(&err).unwrap();
        assert_eq!(u.op, "max_pool2d with kernel (3, 3) and stride (2, 2)");
        assert!(u.replacement.contains("shifted views"), "{}", u.replacement);
        // Another error is not a missing backward.
        let other = candle_core::Error::Msg("shape mismatch".into());
        assert!(unsupported(&other).is_none());
    }
}
