//! The regression and integration suite: one test binary, one module per area.
//!
//! - `cli`: the `nanhunt` binary end to end (exit codes, bad input, output).

mod cli;
mod support;
