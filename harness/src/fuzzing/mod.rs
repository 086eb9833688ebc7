//! The coverage-guided fuzz targets' logic, so that the targets in `fuzz/`
//! stay thin, `cargo test` can run them over their seed corpora, and
//! `nanhunt import-artifact` decodes a crash artifact exactly as the target did.
//!
//! Each target maps fuzzer bytes to a [`Verdict`]: `Reject` (not a valid
//! input: libFuzzer's `Corpus::Reject`), `Pass`, or `Violation` (the target
//! panics with it: a crash artifact).

pub mod decode;
pub mod json_edit;

use crate::augment;
use crate::data::{dense_targets, HostInput};
use crate::error::Error;
use crate::finding::{FindingKind, Outcome};
use crate::losses;
use crate::rng::Rng;
use crate::runner::RunOptions;
use crate::spec::{Case, Limits};
use crate::strategy::safe_envelope;
use crate::training::run_builtin;
use arbitrary::Unstructured;
use candle_core::{Device, Tensor, Var};

/// The targets, by name (the names of `fuzz/fuzz_targets/*.rs` and `corpora/*/`).
pub const TARGETS: [&str; 5] = [
    "case_runs",
    "safe_envelope",
    "losses",
    "augmentations",
    "case_json",
];

/// The targets whose inputs are training runs (their artifacts become reproducers).
pub const TRAINING_TARGETS: [&str; 2] = ["case_runs", "safe_envelope"];

/// What a fuzz target's check says of an input.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Not a valid input: libFuzzer should not keep it.
    Reject,
    /// Valid, and every claim held.
    Pass,
    /// A claim failed: a bug (the target panics with this message).
    Violation(String),
}

/// Which envelope the `safe_envelope` target holds cases to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Envelope {
    /// nanhunt's documented safe envelope (`strategy::safe_envelope`).
    Documented,
    /// A deliberately unsafe one: the documented envelope without its floor
    /// on Adam/RMSprop's eps (0 is allowed). It proves that the target finds
    /// a real violation (0/0 in the update of a parameter whose gradient is 0).
    Planted,
}

impl Envelope {
    /// `NANHUNT_ENVELOPE=planted` selects the planted envelope (for the
    /// fuzz target, which takes no arguments).
    pub fn from_env() -> Envelope {
        match std::env::var("NANHUNT_ENVELOPE").as_deref() {
            Ok("planted") => Envelope::Planted,
            _ => Envelope::Documented,
        }
    }

    /// Holds `case` to this envelope.
    pub fn apply(self, case: &mut Case) {
        safe_envelope(case);
        if self == Envelope::Planted {
            if let Some(eps) = case.optimizer.eps_mut() {
                *eps = 0.0;
            }
        }
    }
}

/// The limits cases are held to while fuzzing: one run stays short.
pub fn limits() -> Limits {
    Limits {
        max_params: 20_000,
        max_steps: 8,
        max_batch: 8,
        max_memory_bytes: 64 << 20,
    }
}

/// Call once per fuzzing process: candle's CPU ops get a one-thread pool
/// (a fuzz target is one process per core).
pub fn init() {
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build_global();
}

/// Decodes the case a training target runs (the envelope applied for
/// `safe_envelope`); None when the bytes do not decode.
pub fn training_case(target: &str, data: &[u8], envelope: Envelope) -> Option<Case> {
    let mut case = decode::case(&mut Unstructured::new(data)).ok()?;
    if target == "safe_envelope" {
        envelope.apply(&mut case);
    }
    Some(case)
}

fn run_options() -> RunOptions {
    RunOptions {
        limits: limits(),
        ..RunOptions::default()
    }
}

/// `case_runs`: any valid case runs to an `Outcome` without a panic or an
/// unexpected error.
pub fn case_runs(data: &[u8]) -> Verdict {
    let Some(case) = training_case("case_runs", data, Envelope::Documented) else {
        return Verdict::Reject;
    };
    if case.validate(&limits()).is_err() {
        return Verdict::Reject;
    }
    match run_builtin(&case, &run_options()) {
        Ok(Outcome::Rejected { .. }) => Verdict::Reject,
        Ok(_) => Verdict::Pass,
        Err(e) => Verdict::Violation(format!("a valid case ended in an error: {e}")),
    }
}

/// `safe_envelope`: cases inside the envelope stay finite.
pub fn safe_envelope_target(data: &[u8], envelope: Envelope) -> Verdict {
    let Some(case) = training_case("safe_envelope", data, envelope) else {
        return Verdict::Reject;
    };
    if case.validate(&limits()).is_err() {
        return Verdict::Reject;
    }
    match run_builtin(&case, &run_options()) {
        Ok(Outcome::Unstable { finding })
            if matches!(
                finding.kind,
                FindingKind::Nan | FindingKind::Inf | FindingKind::Overflow
            ) =>
        {
            Verdict::Violation(format!(
                "a case inside the safe envelope went non-finite: {} at step {}: {}",
                finding.signature, finding.step, finding.detail
            ))
        }
        Ok(Outcome::Rejected { .. }) => Verdict::Reject,
        Ok(_) => Verdict::Pass,
        Err(e) => Verdict::Violation(format!("a valid case ended in an error: {e}")),
    }
}

/// `losses`: a loss documented as stable stays finite, with a finite
/// gradient, over its documented domain ([`losses::stable_domain`]).
pub fn losses_target(data: &[u8]) -> Verdict {
    let bound = |l: &crate::spec::LossSpec| losses::stable_domain(l).unwrap_or(1e36);
    let Ok(input) = decode::loss_input(&mut Unstructured::new(data), bound) else {
        return Verdict::Reject;
    };
    if losses::stable_domain(&input.loss).is_none() {
        return Verdict::Reject;
    }
    match loss_value_and_gradient(&input) {
        Ok((value, grad_ok)) if value.is_finite() && grad_ok => Verdict::Pass,
        Ok((value, grad_ok)) => Verdict::Violation(format!(
            "{} inside its documented domain: loss {value}, gradient {}",
            input.loss.name(),
            if grad_ok { "finite" } else { "not finite" }
        )),
        Err(e) => Verdict::Violation(format!("{}: {e}", input.loss.name())),
    }
}

/// The loss of a decoded input in f32 and whether its gradient is finite.
pub fn loss_value_and_gradient(input: &decode::LossInput) -> candle_core::Result<(f64, bool)> {
    let dev = Device::Cpu;
    let mut rng = Rng::keyed(0, "fuzz.targets", 0);
    let targets = dense_targets(
        &input.labels,
        input.classes,
        input.loss.target_kind(),
        &mut rng,
    );
    let shape = (input.rows, input.classes);
    let z = Var::from_tensor(&Tensor::from_slice(&input.logits, shape, &dev)?)?;
    let t = Tensor::from_slice(&targets, shape, &dev)?;
    let loss = losses::loss(&input.loss, z.as_tensor(), &t)?;
    let value = loss.to_scalar::<f32>()? as f64;
    let grads = loss.backward()?;
    let grad_ok = match grads.get(z.as_tensor()) {
        Some(g) => g
            .flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .all(|v| v.is_finite()),
        None => true,
    };
    Ok((value, grad_ok))
}

/// `augmentations`: an augmentation documented as safe keeps finite inputs
/// (|x| ≤ `augment::DOCUMENTED_MAX_INPUT`) finite.
pub fn augmentations_target(data: &[u8]) -> Verdict {
    let Ok(input) =
        decode::augment_input(&mut Unstructured::new(data), augment::DOCUMENTED_MAX_INPUT)
    else {
        return Verdict::Reject;
    };
    if !augment::documented_safe(&input.augment) {
        return Verdict::Reject;
    }
    let mut batch = input.batch();
    augment::apply(&mut batch, &input.augment, input.seed, 0, input.step);
    let HostInput::Real { values, .. } = &batch.input else {
        return Verdict::Pass;
    };
    match values.iter().position(|v| !v.is_finite()) {
        None => Verdict::Pass,
        Some(i) => Verdict::Violation(format!(
            "{} made a finite input non-finite: value {} at index {i}",
            input.augment.name(),
            values[i]
        )),
    }
}

/// The JSON text a `case_json` input stands for: after a leading 0 byte, a
/// structure-aware edit of a valid case ([`json_edit`], the seeds in
/// `corpora/case_json/structured-*`); else the input itself as UTF-8 text
/// (hand-written seeds, the raw parser).
pub fn case_json_text(data: &[u8]) -> Option<String> {
    match data.split_first() {
        Some((0, rest)) => json_edit::case_text(&mut Unstructured::new(rest)).ok(),
        _ => std::str::from_utf8(data).ok().map(str::to_owned),
    }
}

/// How many `case_json` inputs reach validation: they parse as a case.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaseJsonShare {
    /// Inputs seen.
    pub inputs: usize,
    /// Inputs that parse as a case.
    pub parse: usize,
    /// Inputs that are valid cases.
    pub valid: usize,
}

impl CaseJsonShare {
    /// Counts one input.
    pub fn add(&mut self, data: &[u8]) {
        self.inputs += 1;
        if let Some(case) = case_json_text(data).and_then(|t| Case::from_json(&t).ok()) {
            self.parse += 1;
            self.valid += usize::from(case.validate(&Limits::default()).is_ok());
        }
    }
}

/// `case_json`: the case parser and validation never panic on any bytes,
/// and a valid case survives a JSON round trip unchanged. Inputs that do
/// not parse as a case are rejected from the corpus (they still run).
pub fn case_json(data: &[u8]) -> Verdict {
    let Some(text) = case_json_text(data) else {
        return Verdict::Reject;
    };
    let case = match Case::from_json(&text) {
        Ok(case) => case,
        // Parsed without a panic, but not a case: not kept in the corpus,
        // which would otherwise fill with text that never reaches validation.
        Err(Error::Parse(..)) => return Verdict::Reject,
        Err(_) => return Verdict::Pass,
    };
    match case.validate(&Limits::default()) {
        Ok(()) => {}
        Err(Error::InvalidCase { .. }) => return Verdict::Pass,
        Err(e) => return Verdict::Violation(format!("validation failed with {e}")),
    }
    match Case::from_json(&case.to_json()) {
        Ok(again) if again == case => Verdict::Pass,
        Ok(again) => Verdict::Violation(format!(
            "a valid case changed in a JSON round trip: {case:?} became {again:?}"
        )),
        Err(e) => Verdict::Violation(format!("a valid case did not parse back: {e}")),
    }
}

/// Runs a target by name (None for an unknown name).
pub fn check(target: &str, data: &[u8], envelope: Envelope) -> Option<Verdict> {
    Some(match target {
        "case_runs" => case_runs(data),
        "safe_envelope" => safe_envelope_target(data, envelope),
        "losses" => losses_target(data),
        "augmentations" => augmentations_target(data),
        "case_json" => case_json(data),
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
