//! The arithmetic of a region of half-precision code computed in f32
//! ([`crate::finding::RewriteForm::Widened`]): each op of the region
//! recomputed from what it read — the region's own values in f32 where an
//! op of it made them, any other half-precision tensor cast up — with
//! candle ops and their gradients, so training runs through the region as
//! it runs through the edited lines. The tensors handed on keep the
//! code's dtype; the f32 values the edited code's variables would hold
//! travel beside them ([`Wide`]), keyed by the tensor handed on.

use crate::finding::OpSite;
use crate::instrument::Operand;
use crate::spec::{dtype_max, HalfType};
use candle_core::{bail, DType, Result, Tensor, TensorId};
use std::cell::RefCell;
use std::collections::HashMap;

/// The f32 values of a region's ops, by the tensor each handed on.
#[derive(Default)]
pub struct Wide(HashMap<TensorId, Tensor>);

impl Wide {
    /// A new region's run begins: the last one's values are dropped.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// The f32 value behind `t`, where a region's op handed it on.
    pub fn get(&self, t: &Tensor) -> Option<&Tensor> {
        self.0.get(&t.id())
    }

    /// `wide` handed on in `dtype` as the code's tensor: clamped into the
    /// dtype's range (only the region's ops read it, through `wide`), and
    /// kept behind it.
    pub fn hand_on(&mut self, wide: Tensor, dtype: DType) -> Result<Tensor> {
        let limit = dtype_max(dtype);
        let t = wide.clamp(-limit, limit)?.to_dtype(dtype)?;
        self.0.insert(t.id(), wide);
        Ok(t)
    }
}

/// The tensor op `site` of a region hands on in place of the code's
/// `out`: the op computed again in f32 over what it read, cast back to
/// `back` where the region ends there, else kept in `wide` behind the
/// tensor handed on. A region's `entry` drops the last run's values.
pub fn apply(
    site: &OpSite,
    inputs: &[Operand],
    out: &Tensor,
    back: Option<HalfType>,
    entry: bool,
    wide: &RefCell<Wide>,
) -> Result<Tensor> {
    let mut w = wide.borrow_mut();
    if entry {
        w.clear();
    }
    let read = widened_inputs(inputs, |t| w.get(t).cloned())?;
    let y = recompute(site, &read, out.dims())?;
    match back {
        Some(h) => y.to_dtype(h.dtype()),
        None => w.hand_on(y, out.dtype()),
    }
}

/// What op `site` read, in f32: each tensor's f32 value from `wide` where
/// a region's op made it, else the tensor cast up; numbers as they were.
pub fn widened_inputs(
    inputs: &[Operand],
    wide: impl Fn(&Tensor) -> Option<Tensor>,
) -> Result<Vec<Operand>> {
    let up = |t: &Tensor| match wide(t) {
        Some(w) => Ok(w),
        None if t.dtype().is_float() => t.to_dtype(DType::F32),
        None => Ok(t.clone()),
    };
    inputs
        .iter()
        .map(|o| {
            Ok(match o {
                Operand::Tensor(t) => Operand::Tensor(up(t)?),
                Operand::Tensors(ts) => Operand::Tensors(ts.iter().map(up).collect::<Result<_>>()?),
                Operand::Scalar(v) => Operand::Scalar(*v),
            })
        })
        .collect()
}

/// Op `site` computed again over `inputs` (its operands, in order),
/// shaped as the code's output `out` was; an op this cannot compute again
/// (a module's forward, a cast, a gather) is an error.
pub fn recompute(site: &OpSite, inputs: &[Operand], out: &[usize]) -> Result<Tensor> {
    let ts: Vec<&Tensor> = Operand::tensors(inputs).collect();
    let op = site.op.as_str();
    let y = match (inputs, ts.as_slice()) {
        ([Operand::Tensor(_)], [x]) => unary(site, x, out)?,
        ([Operand::Tensor(_), Operand::Tensor(_)], [a, b]) => binary(op, a, b)?,
        ([Operand::Tensor(x), Operand::Scalar(s)], _) => with_scalar(op, x, *s, false)?,
        ([Operand::Scalar(s), Operand::Tensor(x)], _) => with_scalar(op, x, *s, true)?,
        ([Operand::Tensor(_), Operand::Tensor(_), Operand::Tensor(_)], [m, a, b])
            if op == "where_cond" =>
        {
            m.where_cond(a, b)?
        }
        ([Operand::Tensor(x), Operand::Scalar(a), Operand::Scalar(b)], _) => match op {
            "affine" => x.affine(*a, *b)?,
            "clamp" => x.clamp(*a, *b)?,
            _ => bail!("`{op}` with two numbers is not computed again in f32"),
        },
        _ => bail!("`{op}` with these operands is not computed again in f32"),
    };
    if y.dims() != out {
        bail!(
            "`{op}` computed again has shape {:?}, the code's {out:?}",
            y.dims()
        );
    }
    Ok(y)
}

/// A one-tensor op: elementwise, a reduction (its dimension from the
/// code's text, else from the shapes), a softmax or a view.
fn unary(site: &OpSite, x: &Tensor, out: &[usize]) -> Result<Tensor> {
    let dim = || reduced_dim(site, x.dims(), out);
    Ok(match site.op.as_str() {
        "log" => x.log()?,
        "exp" => x.exp()?,
        "sqrt" => x.sqrt()?,
        "sqr" => x.sqr()?,
        "neg" => x.neg()?,
        "abs" => x.abs()?,
        "recip" => x.recip()?,
        "relu" => x.relu()?,
        "gelu" => x.gelu()?,
        "gelu_erf" => x.gelu_erf()?,
        "silu" => x.silu()?,
        "tanh" => x.tanh()?,
        "erf" => x.erf()?,
        "sigmoid" => candle_nn::ops::sigmoid(x)?,
        "sum" => x.sum(dim()?)?,
        "sum_keepdim" => x.sum_keepdim(dim()?)?,
        "mean" => x.mean(dim()?)?,
        "mean_keepdim" => x.mean_keepdim(dim()?)?,
        "max" => x.max(dim()?)?,
        "max_keepdim" => x.max_keepdim(dim()?)?,
        "min" => x.min(dim()?)?,
        "min_keepdim" => x.min_keepdim(dim()?)?,
        "log_sum_exp" => x.log_sum_exp(dim()?)?,
        "sum_all" => x.sum_all()?,
        "mean_all" => x.mean_all()?,
        "softmax_last_dim" => candle_nn::ops::softmax_last_dim(x)?,
        "softmax" => candle_nn::ops::softmax(x, text_dim(site, x.rank())?)?,
        "log_softmax" => candle_nn::ops::log_softmax(x, text_dim(site, x.rank())?)?,
        "reshape" | "flatten" | "flatten_all" | "flatten_from" | "squeeze" | "unsqueeze" => {
            x.reshape(out)?
        }
        "broadcast_as" | "expand" | "broadcast_left" => x.broadcast_as(out)?,
        "contiguous" => x.contiguous()?,
        "t" => x.t()?,
        "transpose" => {
            let dims: Vec<usize> = site.operands[1..]
                .iter()
                .filter_map(|d| d.parse().ok())
                .collect();
            match dims.as_slice() {
                [a, b] => x.transpose(*a, *b)?,
                _ => bail!("`transpose`'s dimensions are not read from `{}`", site.text),
            }
        }
        op => bail!("`{op}` is not computed again in f32"),
    })
}

/// Two tensors: arithmetic (broadcast where the shapes differ, as
/// candle's broadcast ops do), a clamp between them, a product.
fn binary(op: &str, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    Ok(match op {
        "+" | "add" | "broadcast_add" => a.broadcast_add(b)?,
        "-" | "sub" | "broadcast_sub" => a.broadcast_sub(b)?,
        "*" | "mul" | "broadcast_mul" => a.broadcast_mul(b)?,
        "/" | "div" | "broadcast_div" => a.broadcast_div(b)?,
        "maximum" | "broadcast_maximum" => a.broadcast_maximum(b)?,
        "minimum" | "broadcast_minimum" => a.broadcast_minimum(b)?,
        "matmul" => a.matmul(b)?,
        "broadcast_matmul" => a.broadcast_matmul(b)?,
        "pow" => a.pow(b)?,
        _ => bail!("`{op}` of two tensors is not computed again in f32"),
    })
}

/// A tensor and a number, the number first where `swapped` (`1.0 - p`):
/// candle's own operators, so the bits are the edited line's.
fn with_scalar(op: &str, x: &Tensor, s: f64, swapped: bool) -> Result<Tensor> {
    Ok(match (op, swapped) {
        ("+", false) => (x + s)?,
        ("-", false) => (x - s)?,
        ("*", false) => (x * s)?,
        ("/", false) => (x / s)?,
        ("+", true) => (s + x)?,
        ("-", true) => (s - x)?,
        ("*", true) => (s * x)?,
        ("/", true) => (s / x)?,
        ("powf", false) => x.powf(s)?,
        ("maximum", false) => x.maximum(s)?,
        ("minimum", false) => x.minimum(s)?,
        ("elu", false) => x.elu(s)?,
        _ => bail!("`{op}` with a number is not computed again in f32"),
    })
}

/// The dimension a reduction of `site` reduced: as its text names it
/// (`D::Minus1`, `1`), else the one the shapes allow.
fn reduced_dim(site: &OpSite, dims: &[usize], out: &[usize]) -> Result<usize> {
    if let Ok(d) = text_dim(site, dims.len()) {
        return Ok(d);
    }
    let kept = dims.len() == out.len();
    let fits = |d: usize| match kept {
        true => (0..dims.len()).all(|k| out[k] == if k == d { 1 } else { dims[k] }),
        false => {
            let mut left = dims.to_vec();
            left.remove(d);
            left == out
        }
    };
    let found: Vec<usize> = (0..dims.len()).filter(|&d| fits(d)).collect();
    match found.as_slice() {
        [d] => Ok(*d),
        _ => bail!("the dimension `{}` reduced is not known", site.op),
    }
}

/// The dimension an op's second operand names, as its text writes it.
fn text_dim(site: &OpSite, rank: usize) -> Result<usize> {
    let text = site.operands.get(1).map(String::as_str).unwrap_or_default();
    let last = text.rsplit("::").next().unwrap_or(text);
    let d = match last {
        "Minus1" => rank.checked_sub(1),
        "Minus2" => rank.checked_sub(2),
        n => n.parse::<usize>().ok(),
    };
    match d {
        Some(d) if d < rank => Ok(d),
        _ => bail!("`{}`'s dimension `{text}` is not read", site.op),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::OpKind;
    use candle_core::Device;

    fn site(op: &str, operands: &[&str]) -> OpSite {
        OpSite {
            file: "f.rs".into(),
            line: 1,
            column: 1,
            text: String::new(),
            operands: operands.iter().map(|s| s.to_string()).collect(),
            op: op.into(),
            function: "f".into(),
            kind: OpKind::Reduce,
            binding: None,
        }
    }

    #[test]
    fn a_region_op_computed_again_in_f32_gives_what_the_code_would_in_f32() {
        let x = Tensor::new(&[[300f32, -200.0], [100.0, 400.0]], &Device::Cpu).unwrap();
        let sq = recompute(&site("sqr", &["x"]), &[Operand::Tensor(x.clone())], &[2, 2]).unwrap();
        assert_eq!(
            sq.to_vec2::<f32>().unwrap(),
            x.sqr().unwrap().to_vec2::<f32>().unwrap()
        );
        // The dimension from the text, and from the shapes where the text has none.
        let s = site("sum_keepdim", &["x", "D::Minus1"]);
        let sum = recompute(&s, &[Operand::Tensor(sq.clone())], &[2, 1]).unwrap();
        assert_eq!(sum.to_vec2::<f32>().unwrap(), [[130000.0], [170000.0]]);
        let s = site("sum_keepdim", &["x", "k"]);
        let sum = recompute(&s, &[Operand::Tensor(sq.clone())], &[1, 2]).unwrap();
        assert_eq!(sum.to_vec2::<f32>().unwrap(), [[100000.0, 200000.0]]);
        // A number first: 1 − x.
        let inputs = [Operand::Scalar(1.0), Operand::Tensor(x.clone())];
        let y = recompute(&site("-", &["1.0", "x"]), &inputs, &[2, 2]).unwrap();
        assert_eq!(y.to_vec2::<f32>().unwrap()[0], [-299.0, 201.0]);
        // A select between two tensors by a mask, and a transpose by its
        // written dimensions.
        let mask = Tensor::new(&[[1u8, 0], [0, 1]], &Device::Cpu).unwrap();
        let inputs = [
            Operand::Tensor(mask),
            Operand::Tensor(x.clone()),
            Operand::Tensor(sq.clone()),
        ];
        let s = site("where_cond", &["mask", "&x", "&sq"]);
        let y = recompute(&s, &inputs, &[2, 2]).unwrap();
        assert_eq!(y.to_vec2::<f32>().unwrap()[0], [300.0, 40000.0]);
        let s = site("transpose", &["x", "0", "1"]);
        let y = recompute(&s, &[Operand::Tensor(x.clone())], &[2, 2]).unwrap();
        assert_eq!(y.to_vec2::<f32>().unwrap()[0], [300.0, 100.0]);
        // What cannot be computed again says so.
        let err = recompute(&site("forward", &["x"]), &[Operand::Tensor(x)], &[2, 2]);
        assert!(err.is_err());
    }

    #[test]
    fn the_tensor_handed_on_keeps_the_code_dtype_and_is_finite() {
        let mut wide = Wide::default();
        let w = Tensor::new(&[1e6f32, -3.0], &Device::Cpu).unwrap();
        let t = wide.hand_on(w.clone(), DType::F16).unwrap();
        assert_eq!(t.dtype(), DType::F16);
        assert_eq!(
            t.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap(),
            [65504.0, -3.0]
        );
        assert_eq!(wide.get(&t).unwrap().to_vec1::<f32>().unwrap(), [1e6, -3.0]);
        let inputs = widened_inputs(&[Operand::Tensor(t)], |t| wide.get(t).cloned()).unwrap();
        let Operand::Tensor(up) = &inputs[0] else {
            panic!()
        };
        assert_eq!(up.to_vec1::<f32>().unwrap(), [1e6, -3.0]);
        wide.clear();
    }
}
