#![warn(missing_docs)]
//! nanhunt: a test harness and fuzzer for the numerical stability of
//! neural-network training, on candle.
//!
//! The building blocks (`spec`, `models`, `data`, `augment`, `losses`,
//! `optim`, `device`) are used by the `probe` and the `runner`, which turns a
//! [`spec::Case`] into an [`Outcome`]. See `docs/ARCHITECTURE.md`.

pub(crate) mod augment;
pub(crate) mod backward;
pub mod campaign;
pub(crate) mod checks;
#[cfg(feature = "cli")]
pub mod cli;
pub mod coverage;
pub mod data;
pub mod device;
pub mod diagnose;
pub(crate) mod differential;
pub mod error;
pub mod explain;
/// Finite explosions (the rule is `checks::explosion`, the jump a
/// finding carries is [`finding::Jump`]).
pub mod explosion {
    pub use crate::checks::explosion::*;
}
pub mod fidelity;
pub mod files;
pub mod finding;
pub(crate) mod floats;
pub(crate) mod format;
#[cfg(feature = "arbitrary")]
pub mod fuzzing;
pub mod gradcheck;
pub mod guard;
pub mod hunt;
mod instrument;
pub mod intervention;
pub mod journal;
pub mod kernels;
pub(crate) mod localize;
pub mod losses;
pub mod lrtable;
pub mod merge;
pub mod minimize;
pub mod models;
mod opkind;
pub mod optim;
pub(crate) mod parallel;
pub mod probe;
pub mod progress;
pub(crate) mod record;
pub mod regression;
pub mod replay;
pub mod report;
pub mod repro;
pub mod rng;
pub(crate) mod rules;
pub mod runner;
pub(crate) mod scaler;
pub mod scene;
pub mod spec;
pub(crate) mod state;
pub mod strategy;
mod trace;
pub(crate) mod training;

pub use error::{Error, Result};
pub use finding::OpKind;
pub use finding::{Finding, FindingKind, Outcome, Phase, Signature, Trace, Verdict, Warning};
pub use runner::RunOptions;
pub use spec::{Case, Limits};
pub use trace::{trace, trace_as, traced};

/// `#[nanhunt::instrument]`: records each tensor op of a function (its
/// site, its kind, what it read) during traced re-runs; see
/// `nanhunt_macros::instrument`.
pub use nanhunt_macros::instrument;

/// The runtime `#[nanhunt::instrument]` expands to; not an API.
#[doc(hidden)]
pub use instrument::private as __private;

// The attribute's expansion names `::nanhunt`, in this crate too.
extern crate self as nanhunt;
pub use training::{run, run_model};
