//! The regression and integration suite: one test binary, one module per area.
//!
//! - `campaign`: resume after SIGKILL, shards and merge, the minimizer, corpora/repro.
//! - `cli`: the `nanhunt` binary end to end (exit codes, bad input, output).
//! - `code_bugs`: planted bugs in users' model code: explained, verified by intervention, ranked first.
//! - `crash_safety`: campaigns lose no finding to a kill, a dead or stuck worker.
//! - `datasets`: dataset files in every command, planted bad samples, Python-written files.
//! - `diagnose`: the five-step engine ranks the right cause first.
//! - `dump`: crash dumps, Python interop, replay of dumps and reproducers.
//! - `explosion`: finite explosions found at their step; none on healthy runs over 200 steps.
//! - `guard`: the guard in a user's own loop: planted faults per phase, scenes, replay.
//! - `hunt`: latent bugs in users' models and losses, triggered by the hunt; none in their repairs.
//! - `hostile_input`: out-of-range numbers, oversized cases, non-files, corrupt journals.
//! - `fuzz`: libFuzzer artifacts → reproducers (`import-artifact`), the planted envelope.
//! - `one_engine`: the runner and the guard give the same finding for the same bug.
//! - `nothing_lost`: a campaign's directory deleted under it; a hunt's reproducer replaced whole, its lock and budget.
//! - `lrtable`: `nanhunt lr-table`, its snapshot in snapshots/, formats and bad options.
//! - `report`: deterministic reports, snapshots in snapshots/, self-contained HTML.
//! - `planted`: one planted fault per phase; the producer must be named.
//! - `readme`: the README's Rust blocks, compiled, and checked against the README.
//! - `real_models`: candle-transformers' BERT, Llama and ViT as published.

mod campaign;
mod cli;
mod code_bugs;
mod crash_safety;
mod datasets;
mod diagnose;
mod divergence;
mod dump;
mod explosion;
mod fidelity;
mod fuzz;
mod guard;
mod hostile_input;
mod hunt;
mod instrument;
mod lrtable;
mod nothing_lost;
mod one_engine;
mod op_sight;
mod planted;
mod randomness;
mod readme;
mod readme_commands;
mod real_models;
mod repairs;
mod report;
mod support;
mod verdicts;
