//! The element-wise halves of the LSTM and GRU cells (the matrix products
//! stay in candle), each one op forward and one op backward instead of a
//! dozen small candle ops per time step. Gate layouts follow PyTorch:
//! LSTM (i, f, g, o), GRU (r, z, n).
//!
//! The LSTM's gate nonlinearities are one op (`lstm_activate`), so that the
//! cell updates and every backward pass work from the activated gates with
//! no transcendental function but tanh(c). The cell is split where the
//! tracer records a stage (the LSTM's `c` before `h` is computed from it),
//! so a traced step computes the same values through the same ops as an
//! untraced one.

use super::reference;
use super::{flat, fused_for, real, slice, unpack, with_real, Real};
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, WithDType,
};

/// The activated LSTM gates [σ(i), σ(f), tanh(g), σ(o)] of the
/// pre-activations (B, 4H).
pub fn lstm_activate(gates: &Tensor) -> Result<Tensor> {
    if !fused_for(gates) {
        return reference::lstm_activate(gates);
    }
    gates.contiguous()?.apply_op1(LstmActivate)
}

/// LSTM cell state `f·c_prev + i·g` from the activated gates.
pub fn lstm_c(act: &Tensor, c_prev: &Tensor) -> Result<Tensor> {
    if !fused_for(act) {
        return reference::lstm_c(act, c_prev);
    }
    act.contiguous()?
        .apply_op2(&c_prev.contiguous()?, Cell::LstmC)
}

/// LSTM hidden state `o·tanh(c)` from the activated gates.
pub fn lstm_h(act: &Tensor, c: &Tensor) -> Result<Tensor> {
    if !fused_for(act) {
        return reference::lstm_h(act, c);
    }
    act.contiguous()?.apply_op2(&c.contiguous()?, Cell::LstmH)
}

/// GRU candidate: `tanh(x_n + σ(r)·h_n)`, from the summed r/z
/// pre-activations (B, 2H) and both projections (B, 3H).
pub fn gru_n(rz: &Tensor, xw: &Tensor, hw: &Tensor) -> Result<Tensor> {
    if !fused_for(rz) {
        return reference::gru_n(rz, xw, hw);
    }
    rz.contiguous()?
        .apply_op3(&xw.contiguous()?, &hw.contiguous()?, GruN)
}

/// GRU hidden state: `n + σ(z)·(h_prev - n)`.
pub fn gru_h(rz: &Tensor, n: &Tensor, h_prev: &Tensor) -> Result<Tensor> {
    if !fused_for(rz) {
        return reference::gru_h(rz, n, h_prev);
    }
    rz.contiguous()?
        .apply_op3(&n.contiguous()?, &h_prev.contiguous()?, GruH)
}

/// σ(x) = (1 + tanh(x/2))/2, as `reference::sigmoid`: no overflow for any x.
#[inline(always)]
pub(super) fn sigmoid<T: Real>(x: T) -> T {
    let half: T = real(0.5);
    half + half * (half * x).tanh_fast()
}

/// One row's activation in place: σ on the i, f and o quarters of the
/// 4H pre-activations, tanh on the g quarter. The per-step op and the
/// whole-layer op (`lstm::lstm_layer`) share it, and so compute the same bits.
#[inline(always)]
pub(super) fn activate_row<T: Real>(row: &mut [T], h: usize) {
    // Three plain loops: a chained iterator over the σ quarters did not
    // vectorize.
    let (sig, rest) = row[..4 * h].split_at_mut(2 * h);
    let (g, o) = rest.split_at_mut(h);
    for v in sig.iter_mut() {
        *v = sigmoid(*v);
    }
    for v in g.iter_mut() {
        *v = v.tanh_fast();
    }
    for v in o.iter_mut() {
        *v = sigmoid(*v);
    }
}

/// One row's gate pre-activation gradients from the activated gates `a` and
/// their gradients `da`: a(1 - a) on the σ quarters, 1 - a² on tanh's.
#[inline(always)]
pub(super) fn activate_grad_row<T: Real>(a: &[T], da: &[T], d: &mut [T], h: usize) {
    let one = T::one();
    let (a, da, d) = (&a[..4 * h], &da[..4 * h], &mut d[..4 * h]);
    for range in [0..2 * h, 3 * h..4 * h] {
        let (a, da, d) = (&a[range.clone()], &da[range.clone()], &mut d[range]);
        for j in 0..a.len() {
            d[j] = da[j] * a[j] * (one - a[j]);
        }
    }
    let (a, da, d) = (&a[2 * h..3 * h], &da[2 * h..3 * h], &mut d[2 * h..3 * h]);
    for j in 0..h {
        d[j] = da[j] * (one - a[j] * a[j]);
    }
}

/// One row of the cell state `f·c_prev + i·g`.
#[inline(always)]
pub(super) fn lstm_c_row<T: Real>(a: &[T], c_prev: &[T], out: &mut [T]) {
    let h = out.len();
    let (i, f, g) = (&a[..h], &a[h..2 * h], &a[2 * h..3 * h]);
    let c_prev = &c_prev[..h];
    for j in 0..h {
        out[j] = f[j] * c_prev[j] + i[j] * g[j];
    }
}

/// One row of the hidden state `o·tanh(c)`.
#[inline(always)]
pub(super) fn lstm_h_row<T: Real>(a: &[T], c: &[T], out: &mut [T]) {
    let h = out.len();
    let (o, c) = (&a[3 * h..4 * h], &c[..h]);
    for j in 0..h {
        out[j] = o[j] * c[j].tanh_fast();
    }
}

/// One row of the GRU candidate `tanh(x_n + σ(r)·h_n)` from the summed
/// r/z pre-activations (2H) and both projections (3H each).
#[inline(always)]
pub(super) fn gru_n_row<T: Real>(rz: &[T], xw: &[T], hw: &[T], out: &mut [T]) {
    let h = out.len();
    let (r, xn, hn) = (&rz[..h], &xw[2 * h..3 * h], &hw[2 * h..3 * h]);
    for j in 0..h {
        let reset = sigmoid(r[j]);
        out[j] = (xn[j] + reset * hn[j]).tanh_fast();
    }
}

/// One row of the GRU hidden state `n + σ(z)·(h_prev - n)`.
#[inline(always)]
pub(super) fn gru_h_row<T: Real>(rz: &[T], n: &[T], h_prev: &[T], out: &mut [T]) {
    let h = out.len();
    let (z, n, h_prev) = (&rz[h..2 * h], &n[..h], &h_prev[..h]);
    for j in 0..h {
        let z = sigmoid(z[j]);
        out[j] = n[j] + z * (h_prev[j] - n[j]);
    }
}

fn rows(l: &Layout, what: &str) -> Result<(usize, usize)> {
    match *l.dims() {
        [b, w] => Ok((b, w)),
        ref other => candle_core::bail!("rnn cell: {what} must be 2-D, got {other:?}"),
    }
}

/// σ on the i, f and o quarters of each row, tanh on the g quarter.
struct LstmActivate;

impl CustomOp1 for LstmActivate {
    fn name(&self) -> &'static str {
        "nanhunt-lstm-activate"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, w) = rows(l, "gates")?;
        let h = w / 4;
        with_real!(s, T => {
            let mut act: Vec<T> = slice::<T>(s, l)?.to_vec();
            for row in act.chunks_exact_mut(4 * h) {
                activate_row(row, h);
            }
            Ok((T::to_cpu_storage_owned(act), l.shape().clone()))
        })
    }

    fn bwd(&self, _gates: &Tensor, act: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(act.apply_op2_no_bwd(
            &grad.contiguous()?,
            &LstmActivateGrad,
        )?))
    }
}

/// (act, dact) → dgates: a(1 - a) on the σ quarters, 1 - a² on tanh's.
struct LstmActivateGrad;

impl CustomOp2 for LstmActivateGrad {
    fn name(&self) -> &'static str {
        "nanhunt-lstm-activate-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, w) = rows(l1, "gates")?;
        let h = w / 4;
        with_real!(s1, T => {
            let (act, g) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            let mut d = vec![T::zero(); act.len()];
            let rows = act.chunks_exact(4 * h).zip(g.chunks_exact(4 * h)).zip(d.chunks_exact_mut(4 * h));
            for ((a, g), d) in rows {
                activate_grad_row(a, g, d, h);
            }
            Ok((T::to_cpu_storage_owned(d), l1.shape().clone()))
        })
    }
}

/// The two-input LSTM ops (activated gates, state) → (B, H).
#[derive(Clone, Copy)]
enum Cell {
    LstmC,
    LstmH,
}

impl Cell {
    fn forward<T: Real>(self, act: &[T], state: &[T], h: usize) -> Vec<T> {
        let mut out = vec![T::zero(); state.len()];
        let rows = act
            .chunks_exact(4 * h)
            .zip(state.chunks_exact(h))
            .zip(out.chunks_exact_mut(h));
        for ((a, s), out) in rows {
            match self {
                Cell::LstmC => lstm_c_row(a, s, out),
                Cell::LstmH => lstm_h_row(a, s, out),
            }
        }
        out
    }

    /// [dact (B·4H) | dstate (B·H)] from the output gradient `dy`.
    fn backward<T: Real>(self, act: &[T], state: &[T], dy: &[T], h: usize) -> Vec<T> {
        let b = state.len() / h;
        let mut out = vec![T::zero(); b * 5 * h];
        let (da, ds) = out.split_at_mut(b * 4 * h);
        let one = T::one();
        let rows = act
            .chunks_exact(4 * h)
            .zip(state.chunks_exact(h))
            .zip(dy.chunks_exact(h))
            .zip(da.chunks_exact_mut(4 * h).zip(ds.chunks_exact_mut(h)));
        for (((a, s), d), (dar, dsr)) in rows {
            // Every slice re-cut to exactly h, so that the loops below carry
            // no bounds checks and vectorize.
            let (i, f, g, o) = (&a[..h], &a[h..2 * h], &a[2 * h..3 * h], &a[3 * h..4 * h]);
            let (s, d, dsr) = (&s[..h], &d[..h], &mut dsr[..h]);
            let (di, rest) = dar.split_at_mut(h);
            let (df, rest) = rest.split_at_mut(h);
            let (dg, d_o) = rest.split_at_mut(h);
            let (df, dg, d_o) = (&mut df[..h], &mut dg[..h], &mut d_o[..h]);
            match self {
                Cell::LstmC => {
                    for j in 0..h {
                        di[j] = d[j] * g[j];
                        df[j] = d[j] * s[j];
                        dg[j] = d[j] * i[j];
                        dsr[j] = d[j] * f[j];
                    }
                }
                Cell::LstmH => {
                    for j in 0..h {
                        let tc = s[j].tanh_fast();
                        d_o[j] = d[j] * tc;
                        dsr[j] = d[j] * o[j] * (one - tc * tc);
                    }
                }
            }
        }
        out
    }
}

impl CustomOp2 for Cell {
    fn name(&self) -> &'static str {
        match self {
            Cell::LstmC => "nanhunt-lstm-c",
            Cell::LstmH => "nanhunt-lstm-h",
        }
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, h) = rows(l2, "state")?;
        with_real!(s1, T => {
            let out = self.forward::<T>(slice(s1, l1)?, slice(s2, l2)?, h);
            Ok((T::to_cpu_storage_owned(out), l2.shape().clone()))
        })
    }

    fn bwd(
        &self,
        gates: &Tensor,
        state: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let packed = gates.apply_op3_no_bwd(state, &grad, &CellGrad(*self))?;
        let [dg, ds] = unpack(&packed, [gates.shape(), state.shape()])?;
        Ok((Some(dg), Some(ds)))
    }
}

/// (gates, state, dy) → [dgates | dstate].
struct CellGrad(Cell);

impl CustomOp3 for CellGrad {
    fn name(&self) -> &'static str {
        "nanhunt-lstm-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, h) = rows(l2, "state")?;
        with_real!(s1, T => {
            let out = self.0.backward::<T>(slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?, h);
            flat(out)
        })
    }
}

/// (rz, xw, hw) → n.
struct GruN;

impl CustomOp3 for GruN {
    fn name(&self) -> &'static str {
        "nanhunt-gru-n"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (b, h2) = rows(l1, "rz")?;
        let h = h2 / 2;
        with_real!(s1, T => {
            let (rz, xw, hw) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            let mut n = vec![T::zero(); b * h];
            for r in 0..b {
                let (rz, xw, hw) = (&rz[r * 2 * h..], &xw[r * 3 * h..], &hw[r * 3 * h..]);
                gru_n_row(rz, xw, hw, &mut n[r * h..(r + 1) * h]);
            }
            Ok((T::to_cpu_storage_owned(n), Shape::from((b, h))))
        })
    }

    fn bwd(
        &self,
        rz: &Tensor,
        xw: &Tensor,
        hw: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let ng = Tensor::cat(&[res, &grad.contiguous()?], 1)?;
        let packed = rz.apply_op3_no_bwd(hw, &ng, &GruNGrad)?;
        let [drz, dxw, dhw] = unpack(&packed, [rz.shape(), xw.shape(), hw.shape()])?;
        Ok((Some(drz), Some(dxw), Some(dhw)))
    }
}

/// (rz, hw, [n | dn]) → [drz | dxw | dhw].
struct GruNGrad;

impl CustomOp3 for GruNGrad {
    fn name(&self) -> &'static str {
        "nanhunt-gru-n-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (b, h2) = rows(l1, "rz")?;
        let h = h2 / 2;
        with_real!(s1, T => {
            let (rz, hw, ng) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            let mut out = vec![T::zero(); b * 8 * h];
            let (drz, rest) = out.split_at_mut(b * 2 * h);
            let (dxw, dhw) = rest.split_at_mut(b * 3 * h);
            for r in 0..b {
                for j in 0..h {
                    let (n, dn) = (ng[r * 2 * h + j], ng[r * 2 * h + h + j]);
                    let reset = sigmoid(rz[r * 2 * h + j]);
                    let hn = hw[r * 3 * h + 2 * h + j];
                    let dpre = dn * (T::one() - n * n);
                    dxw[r * 3 * h + 2 * h + j] = dpre;
                    dhw[r * 3 * h + 2 * h + j] = dpre * reset;
                    drz[r * 2 * h + j] = dpre * hn * reset * (T::one() - reset);
                }
            }
            flat(out)
        })
    }
}

/// (rz, n, h_prev) → h.
struct GruH;

impl CustomOp3 for GruH {
    fn name(&self) -> &'static str {
        "nanhunt-gru-h"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (b, h) = rows(l2, "n")?;
        with_real!(s1, T => {
            let (rz, n, hp) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            let mut out = vec![T::zero(); b * h];
            for r in 0..b {
                let (rz, n, hp) = (&rz[r * 2 * h..], &n[r * h..], &hp[r * h..]);
                gru_h_row(rz, n, hp, &mut out[r * h..(r + 1) * h]);
            }
            Ok((T::to_cpu_storage_owned(out), Shape::from((b, h))))
        })
    }

    fn bwd(
        &self,
        rz: &Tensor,
        n: &Tensor,
        h_prev: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let nh = Tensor::cat(&[n, h_prev], 1)?;
        let packed = rz.apply_op3_no_bwd(&nh, &grad.contiguous()?, &GruHGrad)?;
        let [drz, dn, dh] = unpack(&packed, [rz.shape(), n.shape(), h_prev.shape()])?;
        Ok((Some(drz), Some(dn), Some(dh)))
    }
}

/// (rz, [n | h_prev], dh') → [drz | dn | dh_prev].
struct GruHGrad;

impl CustomOp3 for GruHGrad {
    fn name(&self) -> &'static str {
        "nanhunt-gru-h-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (b, h) = rows(l3, "gradient")?;
        with_real!(s1, T => {
            let (rz, nh, g) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            let mut out = vec![T::zero(); b * 4 * h];
            let (drz, rest) = out.split_at_mut(b * 2 * h);
            let (dn, dh) = rest.split_at_mut(b * h);
            for r in 0..b {
                for j in 0..h {
                    let z = sigmoid(rz[r * 2 * h + h + j]);
                    let (nn, hh, d) = (nh[r * 2 * h + j], nh[r * 2 * h + h + j], g[r * h + j]);
                    drz[r * 2 * h + h + j] = d * (hh - nn) * z * (T::one() - z);
                    dn[r * h + j] = d * (T::one() - z);
                    dh[r * h + j] = d * z;
                }
            }
            flat(out)
        })
    }
}
