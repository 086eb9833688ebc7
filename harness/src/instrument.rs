//! The runtime of `#[nanhunt::instrument]` (the attribute is the
//! `nanhunt-macros` crate, re-exported as [`crate::instrument`]): each op
//! it rewrites observes its operands and hands its result here, which
//! records it as an op of the traced re-run active on the thread (its
//! site, its kind, what it read, a gradient probe on what it made) and
//! otherwise passes it through after one flag read.
//!
//! Whether a value is a tensor is decided by its type, through autoref
//! specialization: `(&Look(&x)).look()` resolves to [`LookTensor`] for
//! the types that hold tensors (or numbers) and to [`LookOther`], which
//! sees nothing, for every other type — so an `f64`'s `max`, a module or
//! a `Vec` passes through the rewritten code untouched. The same for
//! results with [`Made`]: a `Result<Tensor>` or a `Tensor` is recorded,
//! anything else handed back as it was.

use crate::finding::Site;
use crate::models::tracer::{record_op, recording};
use crate::models::Operand;
use candle_core::{Result, Tensor, Var};
use std::cell::Cell;

/// A borrowed operand, to be seen if its type holds a tensor.
pub struct Look<'a, T: ?Sized>(pub &'a T);

/// Seeing an operand whose type holds a tensor or a number: what the op
/// read, while a traced re-run is active.
pub trait LookTensor {
    fn look(&self) -> Option<Operand>;
}

/// Any other operand: nothing to see.
pub trait LookOther {
    #[inline(always)]
    fn look(&self) -> Option<Operand> {
        None
    }
}

impl<T: ?Sized> LookOther for &Look<'_, T> {}

macro_rules! look_tensor {
    ($($t:ty => |$v:ident| $e:expr),* $(,)?) => {$(
        impl LookTensor for Look<'_, $t> {
            #[inline]
            fn look(&self) -> Option<Operand> {
                if !recording() {
                    return None;
                }
                let $v = self.0;
                Some($e)
            }
        }
    )*};
}

look_tensor! {
    Tensor => |t| Operand::Tensor(t.clone()),
    &Tensor => |t| Operand::Tensor((*t).clone()),
    &&Tensor => |t| Operand::Tensor((**t).clone()),
    &mut Tensor => |t| Operand::Tensor((**t).clone()),
    Var => |v| Operand::Tensor(v.as_tensor().clone()),
    &Var => |v| Operand::Tensor(v.as_tensor().clone()),
    Result<Tensor> => |r| match r {
        Ok(t) => Operand::Tensor(t.clone()),
        Err(_) => Operand::Tensors(Vec::new()),
    },
    Vec<Tensor> => |ts| Operand::Tensors(ts.clone()),
    &Vec<Tensor> => |ts| Operand::Tensors((*ts).clone()),
    &[Tensor] => |ts| Operand::Tensors(ts.to_vec()),
    &[&Tensor] => |ts| Operand::Tensors(ts.iter().map(|t| (*t).clone()).collect()),
    f64 => |v| Operand::Scalar(*v),
    f32 => |v| Operand::Scalar(f64::from(*v)),
    &f64 => |v| Operand::Scalar(**v),
    &f32 => |v| Operand::Scalar(f64::from(**v)),
}

impl<const N: usize> LookTensor for Look<'_, [Tensor; N]> {
    #[inline]
    fn look(&self) -> Option<Operand> {
        recording().then(|| Operand::Tensors(self.0.to_vec()))
    }
}

impl<const N: usize> LookTensor for Look<'_, &[Tensor; N]> {
    #[inline]
    fn look(&self) -> Option<Operand> {
        recording().then(|| Operand::Tensors(self.0.to_vec()))
    }
}

impl<const N: usize> LookTensor for Look<'_, &[&Tensor; N]> {
    #[inline]
    fn look(&self) -> Option<Operand> {
        recording().then(|| Operand::Tensors(self.0.iter().map(|t| (*t).clone()).collect()))
    }
}

/// An op's result, to be recorded if its type is a tensor's.
pub struct Made<T>(Cell<Option<T>>);

impl<T> Made<T> {
    #[inline(always)]
    pub fn new(value: T) -> Self {
        Made(Cell::new(Some(value)))
    }

    #[inline(always)]
    fn take(&self) -> T {
        self.0.take().expect("an op's result is handed on once")
    }
}

/// The owner of a method's op: `type_name::<Self>`.
pub type Owner = Option<fn() -> &'static str>;

/// Recording a tensor result.
pub trait MadeTensor {
    type Out;
    fn made<const N: usize>(
        &self,
        site: &'static Site,
        inputs: [Option<Operand>; N],
        owner: Owner,
    ) -> Self::Out;
}

/// Any other result: handed back as it was.
pub trait MadeOther<T> {
    fn made<const N: usize>(
        &self,
        site: &'static Site,
        inputs: [Option<Operand>; N],
        owner: Owner,
    ) -> T;
}

impl<T> MadeOther<T> for &Made<T> {
    #[inline(always)]
    fn made<const N: usize>(&self, _: &'static Site, _: [Option<Operand>; N], _: Owner) -> T {
        self.take()
    }
}

impl MadeTensor for Made<Result<Tensor>> {
    type Out = Result<Tensor>;

    #[inline]
    fn made<const N: usize>(
        &self,
        site: &'static Site,
        inputs: [Option<Operand>; N],
        owner: Owner,
    ) -> Result<Tensor> {
        let t = self.take()?;
        record(site, inputs, owner, t)
    }
}

impl MadeTensor for Made<Tensor> {
    type Out = Tensor;

    /// A method that cannot fail (`detach`): a failure to record it leaves
    /// it unrecorded.
    #[inline]
    fn made<const N: usize>(
        &self,
        site: &'static Site,
        inputs: [Option<Operand>; N],
        owner: Owner,
    ) -> Tensor {
        let t = self.take();
        if !recording() {
            return t;
        }
        record(site, inputs, owner, t.clone()).unwrap_or(t)
    }
}

#[inline]
fn record<const N: usize>(
    site: &'static Site,
    inputs: [Option<Operand>; N],
    owner: Owner,
    t: Tensor,
) -> Result<Tensor> {
    if !recording() {
        return Ok(t);
    }
    let inputs = inputs.into_iter().flatten().collect();
    record_op(site, owner.map(|f| f()), inputs, t)
}

/// What the attribute's expansion names (`::nanhunt::__private::…`).
#[doc(hidden)]
pub mod private {
    pub use super::{Look, LookOther, LookTensor, Made, MadeOther, MadeTensor};
    pub use crate::finding::Site;
    pub use crate::models::Operand as Seen;
}
