//! The reference compositions of candle ops behind each fused kernel: used
//! on CUDA, for f16/bf16, under `NANHUNT_KERNELS=reference`, and as the
//! fused kernels' test oracle. Each uses only candle ops whose backward
//! passes pass the gradient check.

use candle_core::{Result, Tensor, D};

/// sigmoid(x) = (1 + tanh(x/2)) / 2: never forms exp(-x), so neither the value
/// nor its gradient overflows for large |x|.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    ((x * 0.5)?.tanh()? + 1.0)? * 0.5
}

/// relu with the common convention for the gradient at 0: slope 0 there,
/// as in PyTorch, TensorFlow and JAX. candle's `Tensor::relu` has slope 1
/// at 0 (its backward masks with x ≥ 0). relu(NaN) = 0, as candle's.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    x.gt(0.0)?.where_cond(x, &x.zeros_like()?)
}

/// Leaky ReLU: x where x > 0, `slope`·x elsewhere; its gradient at 0 is
/// `slope` (the common convention) and leaky(NaN) = NaN.
pub fn leaky_relu(x: &Tensor, slope: f64) -> Result<Tensor> {
    x.gt(0.0)?.where_cond(x, &(x * slope)?)
}

/// x (..., in) · wᵀ + b, the leading dimensions folded into rows (one
/// product, whose weight gradient is one product too).
pub fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let dims = x.dims();
    if dims.len() == 2 {
        // candle's CUDA product takes row-major or transposed operands
        // only, not a column slice (an RNN's time step of its input); the
        // CPU's takes any strides, so its bits are left as they were.
        let x = match x.device().is_cpu() || x.is_contiguous() {
            true => x.clone(),
            false => x.contiguous()?,
        };
        return x.matmul(&w.t()?)?.broadcast_add(b);
    }
    let rows = x.reshape(((), dims[dims.len() - 1]))?;
    let y = rows.matmul(&w.t()?)?.broadcast_add(b)?;
    let mut out = dims.to_vec();
    *out.last_mut().expect("rank >= 1") = w.dim(0)?;
    y.reshape(out)
}

/// Same-padded (k/2), stride-1 convolution plus bias.
pub fn conv2d(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (.., k, _) = w.dims4()?;
    let y = x.conv2d(w, k / 2, 1, 1, 1)?;
    y.broadcast_add(&b.reshape((1, (), 1, 1))?)
}

/// 2×2 max pooling by reshaping into windows; the backward of `max`
/// routes the gradient to the maximum.
pub fn max_pool2x2(x: &Tensor) -> Result<Tensor> {
    windows2x2(x)?.max(5)?.max(3)
}

/// 2×2 average pooling, stride 2, as candle ops.
pub fn avg_pool2x2(x: &Tensor) -> Result<Tensor> {
    windows2x2(x)?.mean(5)?.mean(3)
}

fn windows2x2(x: &Tensor) -> Result<Tensor> {
    let (b, c, h, w) = x.dims4()?;
    let (h2, w2) = (h / 2, w / 2);
    let x = if h % 2 == 1 || w % 2 == 1 {
        x.narrow(2, 0, 2 * h2)?.narrow(3, 0, 2 * w2)?.contiguous()?
    } else {
        x.clone()
    };
    x.reshape((b, c, h2, 2, w2, 2))
}

/// Layer normalization over the last dimension with affine weight and bias.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let centered = x.broadcast_sub(&mean)?;
    let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = centered.broadcast_div(&(var + eps)?.sqrt()?)?;
    normed.broadcast_mul(w)?.broadcast_add(b)
}

/// RMS normalization over the last dimension with its weight.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(w)
}

/// Rotary position embedding of x (B, S, H, hd) with tables cos, sin
/// (S, hd/2), in the "rotate half" layout: the first and second halves of
/// each head's dimensions are the pairs rotated by each position's angle.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (b, s, h, hd) = x.dims4()?;
    let half = hd / 2;
    let (x1, x2) = (x.narrow(3, 0, half)?, x.narrow(3, half, half)?);
    let cos = cos.reshape((1, s, 1, half))?;
    let sin = sin.reshape((1, s, 1, half))?;
    let r1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
    let r2 = (x1.broadcast_mul(&sin)? + x2.broadcast_mul(&cos)?)?;
    Tensor::cat(&[r1, r2], 3)?.reshape((b, s, h, hd))
}

/// SwiGLU's gate: silu(a)·b.
pub fn swiglu(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    a.silu()? * b
}

/// (B, S, D) → (B, heads, S, D/heads), contiguous.
fn split_heads(t: &Tensor, heads: usize) -> Result<Tensor> {
    let (b, s, d) = t.dims3()?;
    t.reshape((b, s, heads, d / heads))?
        .transpose(1, 2)?
        .contiguous()
}

/// Key/value heads (B, S, kv_heads·hd) repeated for the query heads that
/// share them: (B, S, heads·hd), head h a copy of head h / (heads / kv_heads).
pub fn repeat_kv(t: &Tensor, kv_heads: usize, heads: usize) -> Result<Tensor> {
    if kv_heads == heads {
        return Ok(t.clone());
    }
    let (b, s, d) = t.dims3()?;
    let (group, hd) = (heads / kv_heads, d / kv_heads);
    t.reshape((b, s, kv_heads, 1, hd))?
        .broadcast_as((b, s, kv_heads, group, hd))?
        .contiguous()?
        .reshape((b, s, heads * hd))
}

/// Attention scores (B, heads, S, S) = scale · q_h · k_hᵀ.
pub fn attention_scores(
    q: &Tensor,
    k: &Tensor,
    heads: usize,
    scale: Option<f64>,
) -> Result<Tensor> {
    let (q, k) = (split_heads(q, heads)?, split_heads(k, heads)?);
    // k's transpose is a strided view the matrix product reads directly.
    let raw = q.matmul(&k.t()?)?;
    match scale {
        Some(scale) => raw * scale,
        None => Ok(raw),
    }
}

/// Attention context (B, S, D) = p_h · v_h with the heads merged back.
pub fn attention_context(p: &Tensor, v: &Tensor, heads: usize) -> Result<Tensor> {
    let (b, s, d) = v.dims3()?;
    p.matmul(&split_heads(v, heads)?)?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((b, s, d))
}

/// log(softmax(x)) via log-sum-exp with the max subtracted: finite for any finite x.
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&lse)
}

/// Cross-entropy against dense targets: -mean over rows of Σ t·log_softmax(z).
pub fn cross_entropy(z: &Tensor, t: &Tensor) -> Result<Tensor> {
    (t * log_softmax(z)?)?.sum(D::Minus1)?.neg()?.mean_all()
}

/// Softmax over the last dimension with the (detached) row max subtracted.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// The mean over the positions of (B, S, D): (B, D).
pub fn mean_positions(x: &Tensor) -> Result<Tensor> {
    x.mean(1)
}

/// The rows of `table` (V, D) at `ids` (any shape) → (ids..., D): an
/// index select over the flattened ids and a reshape.
pub fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let mut dims = ids.dims().to_vec();
    dims.push(table.dim(D::Minus1)?);
    table.embedding(&ids.flatten_all()?)?.reshape(dims)
}

/// x (B, S, D) + pos (S, D), broadcast over the batch.
pub fn add_positions(x: &Tensor, pos: &Tensor) -> Result<Tensor> {
    x.broadcast_add(pos)
}

/// A (seq, seq) mask of allowed positions (1 where key ≤ query).
pub fn causal_mask(seq: usize, device: &candle_core::Device) -> Result<Tensor> {
    let mask: Vec<u8> = (0..seq)
        .flat_map(|i| (0..seq).map(move |j| u8::from(j <= i)))
        .collect();
    Tensor::from_vec(mask, (seq, seq), device)
}

/// Softmax of attention scores (..., S, S) with the keys after each query
/// blocked: a causal mask (`where_cond` with -inf), then [`softmax`].
pub fn causal_softmax(scores: &Tensor) -> Result<Tensor> {
    let dims = scores.dims();
    let mask = causal_mask(dims[dims.len() - 1], scores.device())?.broadcast_as(dims)?;
    let blocked = Tensor::new(f32::NEG_INFINITY, scores.device())?
        .to_dtype(scores.dtype())?
        .broadcast_as(dims)?;
    softmax(&mask.where_cond(scores, &blocked)?)
}

/// Softmax of attention scores (B, H, Sq, Sk) plus a per-key additive
/// mask (B, 1, 1, Sk) broadcast over heads and queries.
pub fn key_masked_softmax(scores: &Tensor, add: &Tensor) -> Result<Tensor> {
    softmax(&scores.broadcast_add(add)?)
}

fn gate(gates: &Tensor, index: usize, h: usize) -> Result<Tensor> {
    gates.narrow(1, index * h, h)
}

/// The activated LSTM gates [σ(i), σ(f), tanh(g), σ(o)] of (B, 4H)
/// pre-activations in PyTorch's (i, f, g, o) order.
pub fn lstm_activate(gates: &Tensor) -> Result<Tensor> {
    let h = gates.dim(1)? / 4;
    Tensor::cat(
        &[
            sigmoid(&gates.narrow(1, 0, 2 * h)?)?,
            gate(gates, 2, h)?.tanh()?,
            sigmoid(&gate(gates, 3, h)?)?,
        ],
        1,
    )
}

/// LSTM cell state f·c_prev + i·g from the activated gates.
pub fn lstm_c(act: &Tensor, c_prev: &Tensor) -> Result<Tensor> {
    let h = c_prev.dim(1)?;
    (gate(act, 1, h)? * c_prev)? + (gate(act, 0, h)? * gate(act, 2, h)?)?
}

/// LSTM hidden state o·tanh(c) from the activated gates.
pub fn lstm_h(act: &Tensor, c: &Tensor) -> Result<Tensor> {
    let h = c.dim(1)?;
    gate(act, 3, h)? * c.tanh()?
}

/// Every hidden state (B, S, H) of an LSTM layer with zero initial state,
/// step by step, from the inputs x (B, S, in), the input weight (4H, in)
/// and bias (4H) and the hidden weight (4H, H) and bias (4H).
pub fn lstm_layer(
    x: &Tensor,
    w_ih: &Tensor,
    b_ih: &Tensor,
    w_hh: &Tensor,
    b_hh: &Tensor,
) -> Result<Tensor> {
    let (bsz, steps, n_in) = x.dims3()?;
    let h4 = w_hh.dim(0)?;
    let xw = linear(&x.reshape((bsz * steps, n_in))?, w_ih, b_ih)?.reshape((bsz, steps, h4))?;
    let mut h = Tensor::zeros((bsz, h4 / 4), x.dtype(), x.device())?;
    let mut c = h.clone();
    let mut hs = Vec::with_capacity(steps);
    for t in 0..steps {
        let gates = (xw.narrow(1, t, 1)?.squeeze(1)? + linear(&h, w_hh, b_hh)?)?;
        let act = lstm_activate(&gates)?;
        c = lstm_c(&act, &c)?;
        h = lstm_h(&act, &c)?;
        hs.push(h.clone());
    }
    if hs.is_empty() {
        return Tensor::zeros((bsz, 0, h4 / 4), x.dtype(), x.device());
    }
    Tensor::stack(&hs, 1)
}

/// Every hidden state (B, S, H) of a GRU layer with zero initial state,
/// step by step, from the inputs x (B, S, in), the input weight (3H, in)
/// and bias (3H) and the hidden weight (3H, H) and bias (3H).
pub fn gru_layer(
    x: &Tensor,
    w_ih: &Tensor,
    b_ih: &Tensor,
    w_hh: &Tensor,
    b_hh: &Tensor,
) -> Result<Tensor> {
    let (bsz, steps, n_in) = x.dims3()?;
    let h3 = w_hh.dim(0)?;
    let xw = linear(&x.reshape((bsz * steps, n_in))?, w_ih, b_ih)?.reshape((bsz, steps, h3))?;
    let mut h = Tensor::zeros((bsz, h3 / 3), x.dtype(), x.device())?;
    let mut hs = Vec::with_capacity(steps);
    for t in 0..steps {
        let xt = xw.narrow(1, t, 1)?.squeeze(1)?;
        let hw = linear(&h, w_hh, b_hh)?;
        let rz = (xt.narrow(1, 0, 2 * h3 / 3)? + hw.narrow(1, 0, 2 * h3 / 3)?)?;
        let n = gru_n(&rz, &xt, &hw)?;
        h = gru_h(&rz, &n, &h)?;
        hs.push(h.clone());
    }
    if hs.is_empty() {
        return Tensor::zeros((bsz, 0, h3 / 3), x.dtype(), x.device());
    }
    Tensor::stack(&hs, 1)
}

/// Every hidden state (B, S, H) of a tanh RNN layer with zero initial
/// state, step by step, from the inputs x (B, S, in), the input weight
/// (H, in) and bias (H) and the hidden weight (H, H) and bias (H).
pub fn tanh_rnn_layer(
    x: &Tensor,
    w_ih: &Tensor,
    b_ih: &Tensor,
    w_hh: &Tensor,
    b_hh: &Tensor,
) -> Result<Tensor> {
    let (bsz, steps, n_in) = x.dims3()?;
    let hd = w_hh.dim(0)?;
    let xw = linear(&x.reshape((bsz * steps, n_in))?, w_ih, b_ih)?.reshape((bsz, steps, hd))?;
    let mut h = Tensor::zeros((bsz, hd), x.dtype(), x.device())?;
    let mut hs = Vec::with_capacity(steps);
    for t in 0..steps {
        h = (xw.narrow(1, t, 1)?.squeeze(1)? + linear(&h, w_hh, b_hh)?)?.tanh()?;
        hs.push(h.clone());
    }
    if hs.is_empty() {
        return Tensor::zeros((bsz, 0, hd), x.dtype(), x.device());
    }
    Tensor::stack(&hs, 1)
}

/// GRU candidate tanh(x_n + σ(r)·h_n) in PyTorch's (r, z, n) order.
pub fn gru_n(rz: &Tensor, xw: &Tensor, hw: &Tensor) -> Result<Tensor> {
    let h = rz.dim(1)? / 2;
    let r = sigmoid(&gate(rz, 0, h)?)?;
    (gate(xw, 2, h)? + (r * gate(hw, 2, h)?)?)?.tanh()
}

/// GRU hidden state (1 - z)·n + z·h = n + z·(h - n).
pub fn gru_h(rz: &Tensor, n: &Tensor, h_prev: &Tensor) -> Result<Tensor> {
    let h = n.dim(1)?;
    let z = sigmoid(&gate(rz, 1, h)?)?;
    n + (z * (h_prev - n)?)?
}
