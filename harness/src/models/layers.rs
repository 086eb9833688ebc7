//! Layers and ops whose gradients pass the finite-difference check.
//!
//! Linear maps, convolution, ReLU/GELU, pooling, layer-norm and softmax run
//! on the fused CPU kernels of `crate::kernels` where those apply, and on
//! their compositions of candle ops (`kernels::reference`) otherwise.
//! Several candle ops are avoided on purpose (measured on candle 0.11.1, CPU):
//! `candle_nn::ops::layer_norm` gives no gradient to input, weight or bias;
//! `max_pool2d` gives wrong input gradients; `softmax_last_dim` gives no
//! gradient. `gradcheck::tests` keeps the gradient check on both versions.

use crate::kernels::{self, PoolKind};

use crate::spec::{Activation, InitSpec};
use candle_core::{DType, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use super::weight_init;

/// A linear map with the harness's init.
pub struct Linear {
    w: Tensor,
    b: Tensor,
}

impl Linear {
    /// A `fan_in` → `fan_out` map whose weights `init` draws.
    pub fn new(vb: VarBuilder, init: &InitSpec, fan_in: usize, fan_out: usize) -> Result<Self> {
        let w = vb.get_with_hints(
            (fan_out, fan_in),
            "weight",
            weight_init(init, fan_in, fan_out),
        )?;
        let b = vb.get_with_hints(fan_out, "bias", Init::Const(0.0))?;
        Ok(Linear { w, b })
    }

    /// The weight, (fan_out, fan_in).
    pub fn weight(&self) -> &Tensor {
        &self.w
    }

    /// The bias, (fan_out).
    pub fn bias(&self) -> &Tensor {
        &self.b
    }

    /// x: (..., fan_in) → (..., fan_out). Leading dimensions are rows of
    /// one matrix product whose weight gradient is one product too (a
    /// broadcast batched product would form one weight gradient per batch
    /// element and then sum them).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        kernels::linear(x, &self.w, &self.b)
    }
}

/// A 2-D convolution with the harness's init.
pub struct Conv2d {
    w: Tensor,
    b: Tensor,
}

impl Conv2d {
    /// A convolution whose weights `init` draws.
    pub fn new(
        vb: VarBuilder,
        init: &InitSpec,
        in_ch: usize,
        out_ch: usize,
        kernel: usize,
    ) -> Result<Self> {
        let fan_in = in_ch * kernel * kernel;
        let fan_out = out_ch * kernel * kernel;
        let w = vb.get_with_hints(
            (out_ch, in_ch, kernel, kernel),
            "weight",
            weight_init(init, fan_in, fan_out),
        )?;
        let b = vb.get_with_hints(out_ch, "bias", Init::Const(0.0))?;
        Ok(Conv2d { w, b })
    }

    /// Same-padded, stride-1 convolution: (B, C, H, W) → (B, out, H, W).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        kernels::conv2d(x, &self.w, &self.b)
    }
}

/// Layer normalization over the last dimension: (x - mean) / sqrt(var + eps).
pub struct LayerNorm {
    w: Tensor,
    b: Tensor,
    eps: f64,
}

impl LayerNorm {
    /// A layer norm over the last `dim` values.
    pub fn new(vb: VarBuilder, dim: usize, eps: f64) -> Result<Self> {
        let w = vb.get_with_hints(dim, "weight", Init::Const(1.0))?;
        let b = vb.get_with_hints(dim, "bias", Init::Const(0.0))?;
        Ok(LayerNorm { w, b, eps })
    }

    /// Normalizes `x` over its last dimension.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        kernels::layer_norm(x, &self.w, &self.b, self.eps)
    }
}

/// Batch normalization of (B, C, H, W) with the batch's own statistics
/// (training mode; running statistics do not affect training).
/// RMS normalization over the last dimension (Llama's norm), weight
/// initialized to ones.
pub struct RmsNorm {
    w: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// An RMS norm over the last `dim` values.
    pub fn new(vb: VarBuilder, dim: usize, eps: f64) -> Result<Self> {
        Ok(RmsNorm {
            w: vb.get_with_hints(dim, "weight", Init::Const(1.0))?,
            eps,
        })
    }

    /// In half precision the statistics are taken in f32, as Llama's norm
    /// does (x² overflows f16 from |x| = 256; the output would silently be
    /// zeros), and the normalized value is cast back before the weight.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match x.dtype() {
            DType::F16 | DType::BF16 => {
                let ones = Tensor::ones(self.w.shape(), DType::F32, x.device())?;
                kernels::rms_norm(&x.to_dtype(DType::F32)?, &ones, self.eps)?
                    .to_dtype(x.dtype())?
                    .broadcast_mul(&self.w)
            }
            _ => kernels::rms_norm(x, &self.w, self.eps),
        }
    }
}

/// Batch normalization over a batch's channels (training mode).
pub struct BatchNorm2d {
    w: Tensor,
    b: Tensor,
    eps: f64,
}

impl BatchNorm2d {
    /// A batch norm over `channels`.
    pub fn new(vb: VarBuilder, channels: usize, eps: f64) -> Result<Self> {
        let w = vb.get_with_hints(channels, "weight", Init::Const(1.0))?;
        let b = vb.get_with_hints(channels, "bias", Init::Const(0.0))?;
        Ok(BatchNorm2d { w, b, eps })
    }

    /// Normalizes `x` (N, C, H, W) by its channels' batch statistics.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mean = channel_mean(x)?;
        let centered = x.broadcast_sub(&mean)?;
        let var = channel_mean(&centered.sqr()?)?;
        let normed = centered.broadcast_div(&(var + self.eps)?.sqrt()?)?;
        normed
            .broadcast_mul(&self.w.reshape((1, (), 1, 1))?)?
            .broadcast_add(&self.b.reshape((1, (), 1, 1))?)
    }
}

/// Mean over batch and spatial dims, kept as (1, C, 1, 1).
fn channel_mean(x: &Tensor) -> Result<Tensor> {
    x.mean_keepdim(0)?.mean_keepdim(2)?.mean_keepdim(3)
}

/// `x` through `act`.
pub fn activate(x: &Tensor, act: Activation) -> Result<Tensor> {
    match act {
        Activation::Relu => kernels::relu(x),
        Activation::Gelu => kernels::gelu(x),
        Activation::Tanh => kernels::tanh(x),
        Activation::Sigmoid => sigmoid(x),
        Activation::LeakyRelu => kernels::leaky_relu(x),
    }
}

pub use crate::kernels::reference::sigmoid;

/// Softmax over the last dimension with the row max subtracted.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    kernels::softmax_last_dim(x)
}

/// log(softmax(x)) via log-sum-exp with the max subtracted: finite for any finite x.
pub use crate::kernels::reference::log_softmax;

/// 2×2, stride-2 max pooling (odd edges dropped, as PyTorch does).
pub fn max_pool2x2(x: &Tensor) -> Result<Tensor> {
    kernels::pool2x2(x, PoolKind::Max)
}

/// 2×2 average pooling, stride 2.
pub fn avg_pool2x2(x: &Tensor) -> Result<Tensor> {
    kernels::pool2x2(x, PoolKind::Avg)
}

/// Global average pooling: (B, C, H, W) → (B, C).
pub fn global_avg_pool(x: &Tensor) -> Result<Tensor> {
    x.mean(3)?.mean(2)
}

/// A (seq, seq) mask of allowed positions (1 where key ≤ query).
pub use crate::kernels::reference::causal_mask;

/// A scalar tensor of `value` in `dtype`, broadcastable against anything.
pub fn scalar(value: f64, dtype: DType, device: &candle_core::Device) -> Result<Tensor> {
    Tensor::new(value, device)?.to_dtype(dtype)
}
