//! Bugs seen at their op: models and losses written with
//! `#[nanhunt::instrument]` and no `trace_as` / `record_as`, whose findings
//! must name the op (its kind, file, line) that made the non-finite value,
//! forward or backward, and explain it from what the op read; whose latent
//! bugs the hunt must trigger at that op; and whose fixed versions give no
//! finding and no trigger.
//!
//! Each bug's line is marked in the source with `// BUG: <name>`, so the
//! expected line is read from the file, never written twice.
//!
//! - `planted`: the planted suites (`code_bugs`, `repairs`), instrumented.
//! - `latent`: the hunt suite's latent bugs, instrumented.
//! - `composed`: bugs nobody in the other suites has, each a whole
//!   statement that composes several ops.

mod composed;
mod latent;
mod planted;

use crate::support::{scratch, sgd};
use candle_core::Tensor;
use candle_nn::{linear, linear_no_bias, Linear, VarBuilder};
use nanhunt::explain::Pattern;
use nanhunt::hunt::{hunt, HuntOptions, RiskReport, RiskStatus};
use nanhunt::losses::UserLoss;
use nanhunt::models::{Model, ModelFactory, Tracer};
use nanhunt::spec::*;
use nanhunt::{run_model, Finding, OpKind, Outcome, Phase, RunOptions};
use std::sync::Arc;

/// A forward pass over two linear layers (the bug's or its fix's).
pub type Fwd = fn(&Net, &Tensor) -> candle_core::Result<Tensor>;

/// A user's loss of logits and targets (the bug's or its fix's).
pub type LossFn = fn(&Tensor, &Tensor) -> candle_core::Result<Tensor>;

/// Two linear layers and the forward pass that uses them: the same names,
/// so a bug and its fix start from the same weights.
pub struct Net {
    pub fc1: Linear,
    pub fc2: Linear,
    fwd: Fwd,
}

impl Model for Net {
    fn forward(&self, x: &Tensor, _: &mut Tracer) -> candle_core::Result<Tensor> {
        (self.fwd)(self, x)
    }
}

/// fc1: `inputs` → `hidden` (with or without bias), fc2: `head_in` → 4.
#[derive(Clone, Copy)]
pub struct Shape {
    pub inputs: usize,
    pub hidden: usize,
    pub bias: bool,
    pub head_in: usize,
}

pub const MLP: Shape = Shape {
    inputs: 8,
    hidden: 16,
    bias: true,
    head_in: 16,
};

pub fn net(shape: Shape, fwd: Fwd) -> impl ModelFactory + 'static {
    move |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        let fc1 = if shape.bias {
            linear(shape.inputs, shape.hidden, vb.pp("fc1"))?
        } else {
            linear_no_bias(shape.inputs, shape.hidden, vb.pp("fc1"))?
        };
        Ok(Box::new(Net {
            fc1,
            fc2: linear(shape.head_in, 4, vb.pp("fc2"))?,
            fwd,
        }))
    }
}

/// A user's model with 8 features, SGD at 0.05, 30 steps.
pub fn vector(name: &str) -> Case {
    let mut c = Case::example("cnn").unwrap();
    c.model = ModelSpec::Custom(CustomSpec::new(name, InputSpec::Vector { features: 8 }, 4));
    c.optimizer = sgd(0.05);
    c.steps = 30;
    c
}

pub fn all_zero(mut c: Case) -> Case {
    c.data.pathologies = vec![Pathology::AllZero {
        fraction: 0.1,
        from_step: 0,
    }];
    c
}

pub fn scaled(mut c: Case, scale: f64) -> Case {
    c.data.scale = scale;
    c
}

pub fn custom_loss(mut c: Case, name: &str, targets: TargetKind) -> Case {
    c.loss = LossSpec::Custom {
        name: name.into(),
        targets,
    };
    c
}

pub fn opts(loss: Option<&Arc<dyn UserLoss>>) -> RunOptions {
    match loss {
        Some(l) => RunOptions::default().with_loss(l.clone()),
        None => RunOptions::default(),
    }
}

/// Where and what a bug's finding must name.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    pub phase: Phase,
    pub kind: OpKind,
    /// The marker on the op's line: `// BUG: <marker>`.
    pub marker: &'static str,
    pub pattern: Pattern,
    /// Words the explanation must hold (its numbers, its chain).
    pub quote: &'static str,
}

/// The source files of this suite, by their path from the workspace root.
fn source(file: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The line (1-based) of `// BUG: <marker>` in `file`.
pub fn marked_line(file: &str, marker: &str) -> Option<u32> {
    let tag = format!("// BUG: {marker}");
    source(file)
        .lines()
        .position(|l| l.trim_end().ends_with(&tag))
        .map(|i| i as u32 + 1)
}

/// What is wrong with `f` against `want`, or `None` when it names the op,
/// its line and the pattern with the quoted words.
pub fn misnamed(f: &Finding, want: &Expect, file: &str) -> Option<String> {
    let line = marked_line(file, want.marker).expect("the bug's line is marked");
    let e = f.explanation.as_deref();
    let site = f.site.as_ref();
    let got = format!(
        "{:?} at {} ({}), explained {:?}: {}",
        f.phase,
        f.stage,
        site.map_or("no site".into(), |s| s.to_string()),
        e.map(|e| e.pattern),
        e.map_or(f.detail.as_str(), |e| e.sentence.as_str())
    );
    let right_op = site.is_some_and(|s| s.kind == want.kind && s.line == line && s.file == file);
    let explained = e.is_some_and(|e| {
        e.pattern == want.pattern && e.sentence.contains(want.quote) && e.site.as_ref() == site
    });
    // The dedup key is the stage and the op's kind, never its line.
    let key = f.signature.stage.split('#').next().unwrap_or_default();
    let keyed_by_kind = key.ends_with(&format!(".{}", want.kind));
    if f.phase != want.phase || !right_op {
        return Some(format!(
            "{}: wanted {:?} at the {:?} of line {line}; got {got}",
            want.marker, want.phase, want.kind
        ));
    }
    if !explained {
        return Some(format!(
            "{}: wanted {:?} with \"{}\"; got {got}",
            want.marker, want.pattern, want.quote
        ));
    }
    (!keyed_by_kind).then(|| {
        format!(
            "{}: the signature is not keyed by the op's kind: {}",
            want.marker, f.signature.stage
        )
    })
}

/// What is wrong with a bug that must fire on its data: its finding must
/// name the op of `want` at its line, explained (`None`: it does; the
/// finding is printed for `-- --nocapture`).
pub fn fires_as(
    case: &Case,
    factory: &dyn ModelFactory,
    run: &RunOptions,
    want: &Expect,
    file: &str,
) -> Option<String> {
    let f = match finding(case, factory, run) {
        Ok(f) => f,
        Err(e) => return Some(e),
    };
    let wrong = misnamed(&f, want, file);
    if let (None, Some(site), Some(e)) = (&wrong, &f.site, &f.explanation) {
        println!("{}: {site} — {}", want.marker, e.sentence);
    }
    wrong
}

/// The finding of a run that must fail.
pub fn finding(
    case: &Case,
    factory: &dyn ModelFactory,
    opts: &RunOptions,
) -> Result<Finding, String> {
    match run_model(case, factory, opts).map_err(|e| e.to_string())? {
        Outcome::Unstable { finding } => Ok(*finding),
        other => Err(format!(
            "{}: no finding ({})",
            case.family(),
            other.verdict()
        )),
    }
}

/// A run that must be stable.
pub fn stable(case: &Case, factory: &dyn ModelFactory, opts: &RunOptions) -> Option<String> {
    match run_model(case, factory, opts) {
        Ok(Outcome::Stable { .. }) => None,
        Ok(Outcome::Unstable { finding }) => Some(format!(
            "{}: fixed, it still fails: {} at {} ({})",
            case.family(),
            finding.kind.as_str(),
            finding.stage,
            finding.detail
        )),
        other => Some(format!("{}: fixed, {other:?}", case.family())),
    }
}

/// The hunt over `case` (writing reproducers under a scratch directory of
/// its own),
/// and the status of the op its trigger must be credited to.
pub fn hunted(
    case: &Case,
    factory: &dyn ModelFactory,
    run: &RunOptions,
) -> (RiskReport, crate::support::Scratch) {
    // Tests hunt the same family at once: each hunt gets its own directory.
    static HUNTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = HUNTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = scratch(&format!("op-hunt-{}-{n}", case.family()));
    let mut opts = HuntOptions::default().out_to(&*out);
    opts.run = run.clone();
    (hunt(case, factory, &opts).unwrap(), out)
}

/// The trigger the hunt credited to the op on `line`, if any.
pub fn triggered_at(report: &RiskReport, line: u32) -> Option<&nanhunt::hunt::Trigger> {
    report.stages.iter().find_map(|s| match &s.status {
        RiskStatus::Triggered(t) if s.site.as_ref().is_some_and(|x| x.line == line) => Some(&**t),
        _ => None,
    })
}

/// What is wrong with a latent bug's hunt: it must be triggered at the op
/// of `want` (its line and kind), the reproducer must replay with the
/// same finding at that op, explained as `want` says.
pub fn mishunted(
    case: &Case,
    factory: &dyn ModelFactory,
    run: &RunOptions,
    want: &Expect,
    file: &str,
) -> Option<String> {
    let (report, out) = hunted(case, factory, run);
    // `cargo test op_sight -- --nocapture` prints each report.
    println!("{}", report.to_markdown());
    let line = marked_line(file, want.marker).expect("the bug's line is marked");
    let at = report.stages.iter().find(|s| {
        matches!(s.status, RiskStatus::Triggered(_))
            && s.site
                .as_ref()
                .is_some_and(|site| site.line == line && site.file == file)
    });
    let Some(at) = at else {
        return Some(format!(
            "{}: not triggered at line {line}:\n{}",
            want.marker,
            report.to_markdown()
        ));
    };
    let RiskStatus::Triggered(t) = &at.status else {
        unreachable!()
    };
    let dir = out.join(t.reproducer.as_ref()?);
    let replayed = nanhunt::replay::replay(&dir, Some(factory), run).ok()?;
    if !replayed.reproduced() {
        return Some(format!(
            "{}: the reproducer does not replay: {}",
            want.marker, replayed.message
        ));
    }
    let f = replayed.actual?;
    misnamed(&f, want, file)
}

/// The fixed version's hunt finds nothing within the bound.
pub fn quiet_hunt(case: &Case, factory: &dyn ModelFactory, run: &RunOptions) -> Option<String> {
    let (report, _out) = hunted(case, factory, run);
    report.found().then(|| {
        format!(
            "{}, fixed: the hunt found\n{}",
            case.family(),
            report.to_markdown()
        )
    })
}

/// The fixed version's hunt finds no trigger at its repaired statement:
/// the line marked `// FIX: <marker>`, or the bug's own line when the fix
/// shares it (another constant given to the same function).
pub fn quiet_at(
    case: &Case,
    factory: &dyn ModelFactory,
    run: &RunOptions,
    marker: &str,
    file: &str,
) -> Option<String> {
    let tag = format!("// FIX: {marker}");
    let fix_line = source(file)
        .lines()
        .position(|l| l.trim_end().ends_with(&tag))
        .map(|i| i as u32 + 1);
    let lines: Vec<u32> = fix_line
        .into_iter()
        .chain(marked_line(file, marker))
        .collect();
    let (report, _out) = hunted(case, factory, run);
    let fired = report.stages.iter().find(|s| {
        matches!(
            s.status,
            RiskStatus::Triggered(_) | RiskStatus::FiredOnData { .. }
        ) && s
            .site
            .as_ref()
            .is_some_and(|site| site.file == file && lines.contains(&site.line))
    });
    fired.map(|s| {
        format!(
            "{}, fixed: the hunt fired its repaired statement at `{}`:\n{}",
            case.family(),
            s.stage,
            report.to_markdown()
        )
    })
}

/// Fails with every message, when there is one.
pub fn all_hold(what: &str, total: usize, failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} of {total} {what}:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
