//! The regression and integration suite: one test binary, one module per area.
//!
//! - `campaign`: resume after SIGKILL, shards and merge, the minimizer, corpora/repro.
//! - `cli`: the `nanhunt` binary end to end (exit codes, bad input, output).
//! - `code_bugs`: planted bugs in users' model code: explained, verified by intervention, ranked first.
//! - `crash_safety`: campaigns lose no finding to a kill, a dead or stuck worker.
//! - `datasets`: dataset files in every command, planted bad samples, Python-written files.
//! - `diagnose`: the five-step engine ranks the right cause first.
//! - `divergence`: the divergence rule in a user's loop, judged over the steps after a crossing.
//! - `dump`: crash dumps, Python interop, replay of dumps and reproducers.
//! - `explosion`: finite explosions found at their step; none on healthy runs over 200 steps.
//! - `fidelity`: findings re-run in f32 and f64 from the same state, and their precision marks.
//! - `fuzz`: libFuzzer artifacts → reproducers (`import-artifact`), the planted envelope.
//! - `guard`: the guard in a user's own loop: planted faults per phase, scenes, replay.
//! - `hostile_input`: out-of-range numbers, oversized cases, non-files, corrupt journals.
//! - `hunt`: latent bugs in users' models and losses, triggered by the hunt; none in their repairs.
//! - `instrument`: `#[nanhunt::instrument]` on the shapes users write.
//! - `lrtable`: `nanhunt lr-table`, its snapshot in snapshots/, formats and bad options.
//! - `nothing_lost`: a campaign's directory deleted under it; hunts' reproducers replaced whole, their lock and budget; unfit cases; merge and replay checks.
//! - `one_engine`: the runner and the guard give the same finding for the same bug.
//! - `op_sight`: bugs named at their op and line, explained, repaired by a rewrite that trains.
//! - `planted`: one planted fault per phase; the producer must be named.
//! - `pytorch_findings`: every reproducer's framework mark against the PyTorch run the table recorded.
//! - `randomness`: replay of a model that draws random numbers says so.
//! - `readme`: the Rust blocks of the README and the reference pages, compiled, and checked against them.
//! - `readme_commands`: the shell commands of the README and the reference pages, run as written.
//! - `real_models`: candle-transformers' BERT, Llama and ViT as published.
//! - `repairs`: planted bugs in users' code, each beside its developer's fix: the repair learns like it.
//! - `report`: deterministic reports, snapshots in snapshots/, self-contained HTML.
//! - `verdicts`: no finding on healthy models over 200 steps across rates and optimizers.

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
mod pytorch_findings;
mod randomness;
mod readme;
mod readme_commands;
mod real_models;
mod repairs;
mod report;
mod support;
mod verdicts;
