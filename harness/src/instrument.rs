//! The runtime of `#[nanhunt::instrument]` (the attribute is the
//! `nanhunt-macros` crate, re-exported as [`crate::instrument`]): each op
//! it rewrites observes its operands and hands its result here, which
//! passes it to the traced re-run active on the thread (the tracer
//! records it: its site, its kind, what it read, a gradient probe on what
//! it made) and otherwise hands it back after one flag read.
//!
//! This module sits on the ground floor, below everything that may be
//! instrumented (the optimizers' op chain included): the tracer above it
//! registers itself as the sink of ops ([`set_sink`]) instead of being
//! imported.
//!
//! Whether a value is a tensor is decided by its type, through autoref
//! specialization: `(&Look(&x)).look()` resolves to [`LookTensor`] for
//! the types that hold tensors (or numbers) and to [`LookOther`], which
//! sees nothing, for every other type — so an `f64`'s `max`, a module or
//! a `Vec` passes through the rewritten code untouched. The same for
//! results with [`Made`]: a `Result<Tensor>` or a `Tensor` is recorded,
//! anything else handed back as it was.

use crate::opkind::OpKind;
use candle_core::{Result, Tensor, Var};
use std::cell::Cell;
use std::sync::OnceLock;

/// An instrumented op's place in the source, as the attribute writes it:
/// one `static` per op, so a record holds a reference.
#[derive(Debug)]
pub struct Site {
    /// The source file, as `file!()` gives it (relative to the workspace).
    pub file: &'static str,
    /// The line.
    pub line: u32,
    /// The column.
    pub column: u32,
    /// The op's expression as written (spacing normalized).
    pub text: &'static str,
    /// Each operand's text as written, receiver first (spacing normalized).
    pub operands: &'static [&'static str],
    /// The method, function or operator: `log`, `softmax`, `/`.
    pub op: &'static str,
    /// The instrumented function the op is in.
    pub function: &'static str,
    /// What the op computes, from the method, function or operator.
    pub kind: OpKind,
    /// The name its statement binds its result to (`let h = x.exp()?;`),
    /// or empty.
    pub binding: &'static str,
}

/// An operand an instrumented op read.
#[derive(Clone, Debug)]
pub enum Operand {
    /// A tensor.
    Tensor(Tensor),
    /// A number (a literal, an `f64` or `f32` value).
    Scalar(f64),
    /// A list of tensors (a concatenation's).
    Tensors(Vec<Tensor>),
}

impl Operand {
    /// The tensors among `inputs`, in order.
    pub fn tensors(inputs: &[Operand]) -> impl Iterator<Item = &Tensor> {
        inputs.iter().flat_map(|o| match o {
            Operand::Tensor(t) => std::slice::from_ref(t),
            Operand::Tensors(ts) => ts.as_slice(),
            Operand::Scalar(_) => &[],
        })
    }

    /// The scalars among `inputs`, in order.
    pub fn scalars(inputs: &[Operand]) -> impl Iterator<Item = f64> + '_ {
        inputs.iter().filter_map(|o| match o {
            Operand::Scalar(v) => Some(*v),
            _ => None,
        })
    }
}

thread_local! {
    /// Whether a traced re-run is active on this thread.
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
}

/// Whether a traced re-run is active on this thread (one flag read).
#[inline]
pub fn recording() -> bool {
    ACTIVE.with(Cell::get)
}

/// Sets whether a traced re-run is active on this thread; returns what it was.
pub(crate) fn set_recording(on: bool) -> bool {
    ACTIVE.with(|a| a.replace(on))
}

/// Where an op goes while a traced re-run is active: the tracer's.
pub(crate) type Sink =
    fn(&'static Site, Option<&'static str>, Vec<Operand>, Tensor) -> Result<Tensor>;

static SINK: OnceLock<Sink> = OnceLock::new();

/// Registers the sink of ops (the tracer does, when it first shares).
pub(crate) fn set_sink(sink: Sink) {
    let _ = SINK.set(sink);
}

fn record_op(
    site: &'static Site,
    owner: Option<&'static str>,
    inputs: Vec<Operand>,
    t: Tensor,
) -> Result<Tensor> {
    match SINK.get() {
        Some(sink) => sink(site, owner, inputs, t),
        None => Ok(t),
    }
}

/// A borrowed operand, to be seen if its type holds a tensor.
pub struct Look<'a, T: ?Sized>(pub &'a T);

/// Seeing an operand whose type holds a tensor or a number: what the op
/// read, while a traced re-run is active.
pub trait LookTensor {
    /// What the op read, when it is a tensor or a number.
    fn look(&self) -> Option<Operand>;
}

/// Any other operand: nothing to see.
pub trait LookOther {
    /// Nothing.
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
    /// Holds an op's result until it is handed on.
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
    /// The result handed on.
    type Out;
    /// Records the result at `site` with what the op read, and hands it on.
    fn made<const N: usize>(
        &self,
        site: &'static Site,
        inputs: [Option<Operand>; N],
        owner: Owner,
    ) -> Self::Out;
}

/// Any other result: handed back as it was.
pub trait MadeOther<T> {
    /// Hands the result on.
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
    pub use super::Operand as Seen;
    pub use super::{Look, LookOther, LookTensor, Made, MadeOther, MadeTensor, Site};
}
