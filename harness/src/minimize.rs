//! Domain-aware shrinking of a failing case while its signature holds.
//!
//! Greedy passes over candidate simplifications (fewer steps, smaller
//! batch, fewer and narrower layers, shorter sequences, fewer augmentations
//! and injected values, simpler optimizer and schedule, rounder numbers); a
//! candidate is kept when it still fails with the same signature. Ends at a
//! fixpoint (a full pass keeps nothing) or when the run budget is spent.
//! Every candidate is no larger than the case it came from, so the result
//! never grows.
//!
//! A case that draws from a dataset is first shrunk to the samples it needs:
//! delta debugging (ddmin) over the sample indices its failing run drew,
//! keeping a subset whenever the signature holds.

use crate::error::Result;
use crate::finding::{Outcome, Signature};
use crate::models::ModelFactory;
use crate::runner::RunOptions;
use crate::spec::*;
use crate::training::run_model;
use serde::Serialize;

pub use crate::spec::{round1, CaseSize};

/// How the minimizer shrinks. Built from `MinimizeOptions::default()`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MinimizeOptions {
    /// Training runs the minimizer may spend (the first reproduction included).
    pub max_runs: usize,
    /// How each candidate runs.
    pub run: RunOptions,
    /// Stop starting candidates after this moment (a campaign's budget);
    /// what was kept so far is the result.
    pub deadline: Option<std::time::Instant>,
}

impl MinimizeOptions {
    /// At most `runs` training runs.
    pub fn with_max_runs(mut self, runs: usize) -> Self {
        self.max_runs = runs;
        self
    }

    /// Each run with `run`.
    pub fn with_run(mut self, run: RunOptions) -> Self {
        self.run = run;
        self
    }

    /// No candidate started after `deadline`.
    pub fn with_deadline(mut self, deadline: std::time::Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }
}

impl Default for MinimizeOptions {
    fn default() -> Self {
        MinimizeOptions {
            max_runs: 300,
            run: RunOptions::default(),
            deadline: None,
        }
    }
}

/// [`CaseSize::of`], with a custom model's parameters counted by building
/// it with its factory (a spec alone cannot say).
pub fn measured_size(case: &Case, factory: Option<&dyn ModelFactory>) -> CaseSize {
    let mut size = CaseSize::of(case);
    if let (ModelSpec::Custom(_), Some(f)) = (&case.model, factory) {
        let store = crate::models::ParamStore::new(
            case.seed,
            case.model.init(),
            case.precision.master_dtype(),
            candle_core::Device::Cpu,
        )
        .with_overrides(case.model.init_overrides());
        let knobs = crate::models::Knobs::of(&case.model);
        if f.build_with(store.creating_builder(), &case.model, &knobs)
            .is_ok()
        {
            size.params = store.count();
        }
    }
    size
}

/// A minimized failing case.
#[derive(Clone, Debug, Serialize)]
pub struct Minimized {
    /// The smallest case that still fails the same way.
    pub case: Case,
    /// Its signature.
    pub signature: Signature,
    /// The failing step of the minimized case.
    pub step: usize,
    /// Training runs spent, the first reproduction included.
    pub runs: usize,
    /// The case's size before.
    pub before: CaseSize,
    /// Its size after.
    pub after: CaseSize,
    /// Whether a full pass found nothing more to remove (else the budget ran out).
    pub fixpoint: bool,
    /// The dataset samples the minimized case keeps, in words.
    pub samples: Option<String>,
}

impl Minimized {
    /// The reproducer of this result: the minimized case, its expected
    /// signature and step, and where it came from.
    pub fn reproducer(&self, original: &Case, source: String) -> crate::repro::Reproducer {
        use crate::repro::{Expected, Provenance, Reproducer, REPRO_FORMAT};
        Reproducer {
            format: REPRO_FORMAT,
            case: self.case.clone(),
            expected: Expected {
                signature: self.signature.clone(),
                step: self.step,
            },
            provenance: Provenance {
                nanhunt_version: env!("CARGO_PKG_VERSION").to_string(),
                original: Some(original.clone()),
                runs_used: self.runs,
                source,
                samples: self.samples.clone(),
            },
        }
    }
}

/// Candidate simplifications of `c`, whose failure is at `step`, simplest
/// first: the [`proposals`] that grow no size axis (a guard: the proposals
/// are written, and tested, never to grow one).
fn candidates(c: &Case, step: usize) -> Vec<Case> {
    let size = CaseSize::of(c);
    proposals(c, step)
        .into_iter()
        .filter(|n| CaseSize::of(n).within(&size))
        .collect()
}

/// Each differs from `c` in one respect.
fn proposals(c: &Case, step: usize) -> Vec<Case> {
    let mut out = Vec::new();
    let mut push = |f: &dyn Fn(&mut Case)| {
        let mut n = c.clone();
        f(&mut n);
        if &n != c {
            out.push(n);
        }
    };
    // Time and batch.
    push(&|n| n.steps = (step + 1).min(n.steps));
    for &b in &[1, 2, c.batch_size / 2, c.batch_size.saturating_sub(1)] {
        push(&|n| n.batch_size = b.max(1).min(n.batch_size));
    }
    // Data pathologies (delta debugging: all, then one at a time) and fewer injected values.
    push(&|n| n.data.pathologies.clear());
    for i in 0..c.data.pathologies.len() {
        push(&|n| {
            n.data.pathologies.remove(i);
        });
        push(&|n| set_from_step(&mut n.data.pathologies[i], 0));
        push(&|n| scale_fraction(&mut n.data.pathologies[i], 0.5));
    }
    // Sample order.
    push(&|n| {
        if let Some(s) = n.data.source.sampling_mut() {
            s.shuffle = false;
            s.drop_last = false;
        }
    });
    // Augmentations.
    push(&|n| n.augment.clear());
    for i in 0..c.augment.len() {
        push(&|n| {
            n.augment.remove(i);
        });
    }
    // Model.
    for n in model_candidates(c) {
        push(&|m| *m = n.clone());
    }
    // Optimizer, schedule, clipping.
    push(&|n| n.schedule = ScheduleSpec::Constant);
    push(&|n| n.clip = ClipSpec::None);
    push(&|n| simplify_optimizer(&mut n.optimizer));
    push(&|n| {
        let lr = round1(n.optimizer.lr());
        n.optimizer.set_lr(lr)
    });
    // Data knobs and rounder numbers.
    push(&|n| n.data.offset = 0.0);
    push(&|n| n.data.scale = round1(n.data.scale));
    push(&|n| n.data.scale = 1.0);
    push(&|n| n.data.noise = DataSpec::default().noise);
    push(&|n| n.data.distribution = Distribution::Normal);
    push(&|n| n.seed = 0);
    push(&|n| n.divergence_factor = 4.0);
    push(&|n| {
        if let LossSpec::CrossEntropy { label_smoothing } = &mut n.loss {
            *label_smoothing = 0.0;
        }
    });
    out
}

fn set_from_step(p: &mut Pathology, v: usize) {
    match p {
        Pathology::Nan { from_step, .. }
        | Pathology::Inf { from_step, .. }
        | Pathology::Extreme { from_step, .. }
        | Pathology::ConstantFeature { from_step, .. }
        | Pathology::AllZero { from_step, .. }
        | Pathology::Subnormal { from_step, .. }
        | Pathology::LabelOutOfRange { from_step, .. } => *from_step = v,
    }
}

fn scale_fraction(p: &mut Pathology, k: f64) {
    match p {
        Pathology::Nan { fraction, .. }
        | Pathology::Inf { fraction, .. }
        | Pathology::Extreme { fraction, .. }
        | Pathology::AllZero { fraction, .. }
        | Pathology::Subnormal { fraction, .. }
        | Pathology::LabelOutOfRange { fraction, .. } => {
            *fraction = round1(*fraction * k).max(1e-6)
        }
        Pathology::ConstantFeature { .. } => {}
    }
}

fn simplify_optimizer(o: &mut OptimizerSpec) {
    match o {
        OptimizerSpec::Sgd {
            momentum,
            nesterov,
            weight_decay,
            ..
        } => {
            *momentum = 0.0;
            *nesterov = false;
            *weight_decay = 0.0;
        }
        OptimizerSpec::Adam {
            beta1,
            beta2,
            weight_decay,
            ..
        }
        | OptimizerSpec::Adamw {
            beta1,
            beta2,
            weight_decay,
            ..
        } => {
            *beta1 = 0.9;
            *beta2 = 0.999;
            *weight_decay = 0.0;
        }
        OptimizerSpec::Rmsprop {
            alpha,
            momentum,
            weight_decay,
            ..
        } => {
            *alpha = 0.99;
            *momentum = 0.0;
            *weight_decay = 0.0;
        }
    }
}

fn model_candidates(c: &Case) -> Vec<Case> {
    let mut out = Vec::new();
    let mut with = |f: &dyn Fn(&mut ModelSpec)| {
        let mut n = c.clone();
        f(&mut n.model);
        if n.model != c.model {
            out.push(n);
        }
    };
    match &c.model {
        ModelSpec::Cnn(m) => {
            for i in 0..m.blocks.len() {
                with(&|s| {
                    if let ModelSpec::Cnn(m) = s {
                        if m.blocks.len() > 1 {
                            m.blocks.remove(i);
                            m.fix_residuals();
                        }
                    }
                });
                with(&|s| {
                    if let ModelSpec::Cnn(m) = s {
                        let b = &mut m.blocks[i];
                        b.channels = (b.channels / 2).max(1);
                        m.fix_residuals();
                    }
                });
                with(&|s| {
                    if let ModelSpec::Cnn(m) = s {
                        let b = &mut m.blocks[i];
                        b.kernel = 1;
                        b.residual = false;
                        b.pool = Pool::None;
                    }
                });
                with(&|s| {
                    if let ModelSpec::Cnn(m) = s {
                        m.blocks[i].batch_norm_eps = None;
                        m.blocks[i].activation = Activation::Relu;
                    }
                });
            }
            with(&|s| {
                if let ModelSpec::Cnn(m) = s {
                    m.height = (m.height / 2).max(1);
                    m.width = (m.width / 2).max(1);
                }
            });
            with(&|s| {
                if let ModelSpec::Cnn(m) = s {
                    m.channels = 1;
                    m.fix_residuals();
                }
            });
            with(&|s| set_classes(s, 2));
        }
        ModelSpec::Transformer(_) => {
            with(&|s| {
                if let ModelSpec::Transformer(t) = s {
                    t.layers = (t.layers - 1).max(1);
                }
            });
            with(&|s| {
                if let ModelSpec::Transformer(t) = s {
                    t.d_model /= t.heads;
                    t.heads = 1;
                }
            });
            with(&|s| {
                if let ModelSpec::Transformer(t) = s {
                    if t.d_model % (2 * t.heads) == 0 {
                        t.d_model /= 2;
                    }
                }
            });
            with(&|s| {
                if let ModelSpec::Transformer(t) = s {
                    t.mlp_ratio = 1;
                }
            });
            with(&|s| {
                if let ModelSpec::Transformer(t) = s {
                    t.seq_len = (t.seq_len / 2).max(1);
                }
            });
            with(&|s| {
                if let ModelSpec::Transformer(t) = s {
                    t.causal = false;
                    t.head = HeadKind::Classify;
                }
            });
            with(&|s| set_classes(s, 2));
        }
        ModelSpec::Decoder(_) => {
            with(&|s| {
                if let ModelSpec::Decoder(d) = s {
                    d.layers = (d.layers - 1).max(1);
                }
            });
            with(&|s| {
                if let ModelSpec::Decoder(d) = s {
                    d.d_model /= d.heads;
                    (d.heads, d.kv_heads) = (1, 1);
                }
            });
            with(&|s| {
                if let ModelSpec::Decoder(d) = s {
                    if d.d_model % (4 * d.heads) == 0 {
                        d.d_model /= 2;
                    }
                }
            });
            with(&|s| {
                if let ModelSpec::Decoder(d) = s {
                    d.mlp_ratio = 1;
                }
            });
            with(&|s| {
                if let ModelSpec::Decoder(d) = s {
                    d.seq_len = (d.seq_len / 2).max(1);
                }
            });
        }
        ModelSpec::Encoder(_) => {
            with(&|s| {
                if let ModelSpec::Encoder(e) = s {
                    e.layers = (e.layers - 1).max(1);
                }
            });
            with(&|s| {
                if let ModelSpec::Encoder(e) = s {
                    e.d_model /= e.heads;
                    e.heads = 1;
                }
            });
            with(&|s| {
                if let ModelSpec::Encoder(e) = s {
                    e.mlp_ratio = 1;
                }
            });
            with(&|s| {
                if let ModelSpec::Encoder(e) = s {
                    e.seq_len = (e.seq_len / 2).max(e.min_length).max(1);
                }
            });
            with(&|s| set_classes(s, 2));
        }
        ModelSpec::Rnn(_) => {
            with(&|s| {
                if let ModelSpec::Rnn(r) = s {
                    r.layers = (r.layers - 1).max(1);
                }
            });
            with(&|s| {
                if let ModelSpec::Rnn(r) = s {
                    r.hidden = (r.hidden / 2).max(1);
                }
            });
            with(&|s| {
                if let ModelSpec::Rnn(r) = s {
                    r.seq_len = (r.seq_len / 2).max(1);
                }
            });
            with(&|s| {
                if let ModelSpec::Rnn(r) = s {
                    r.features = 1;
                }
            });
            with(&|s| set_classes(s, 2));
        }
        ModelSpec::Custom(c) => {
            // Rounder knob values, one knob at a time, kept in their range.
            for name in c.knobs.keys() {
                with(&|s| {
                    if let Some(k) = s.knobs_mut().and_then(|k| k.get_mut(name)) {
                        k.value = round1(k.value).clamp(k.min, k.max);
                    }
                });
            }
        }
    }
    with(&|s| {
        let init = s.init_mut();
        init.gain = round1(init.gain);
    });
    out
}

fn set_classes(s: &mut ModelSpec, n: usize) {
    match s {
        ModelSpec::Cnn(m) => m.classes = m.classes.min(n),
        ModelSpec::Transformer(t) => t.classes = t.classes.min(n),
        ModelSpec::Rnn(r) => r.classes = r.classes.min(n),
        ModelSpec::Encoder(e) => e.classes = e.classes.min(n),
        // The classes are the vocabulary: the inputs and targets share it.
        ModelSpec::Decoder(_) | ModelSpec::Custom(_) => {}
    }
}

/// Runs a candidate with the user's factory, or the built-in family's own
/// (which depends on the candidate's model spec).
fn run_candidate(
    case: &Case,
    factory: Option<&dyn ModelFactory>,
    opts: &RunOptions,
) -> Result<Outcome> {
    // Only the signature matters here: no precision re-runs.
    let opts = &RunOptions {
        fidelity: false,
        ..opts.clone()
    };
    match factory {
        Some(f) => run_model(case, f, opts),
        None => crate::training::run_builtin(case, opts),
    }
}

/// A minimization in progress: the case kept so far, its failing step,
/// and the runs spent.
struct Search<'a> {
    factory: Option<&'a dyn ModelFactory>,
    opts: &'a MinimizeOptions,
    signature: Signature,
    current: Case,
    step: usize,
    runs: usize,
}

impl Search<'_> {
    fn spent(&self) -> bool {
        self.runs >= self.opts.max_runs
            || self
                .opts
                .deadline
                .is_some_and(|d| std::time::Instant::now() >= d)
    }

    /// Runs a candidate; keeps it when it fails with the signature.
    fn keeps(&mut self, candidate: Case) -> bool {
        if candidate.validate(&self.opts.run.limits).is_err() {
            return false;
        }
        self.runs += 1;
        // A candidate that errors (a bug it uncovers) is simply not kept.
        if let Ok(Outcome::Unstable { finding }) =
            run_candidate(&candidate, self.factory, &self.opts.run)
        {
            if finding.signature == self.signature {
                self.current = candidate;
                self.step = finding.step;
                return true;
            }
        }
        false
    }

    /// The case drawing only `samples`.
    fn with_samples(&self, samples: &[usize]) -> Case {
        let mut c = self.current.clone();
        if let Some(s) = c.data.source.sampling_mut() {
            s.indices = Some(samples.to_vec());
            s.exclude.clear();
        }
        c
    }

    /// Delta debugging over the samples the failing run drew (up to its
    /// failing step): the smallest subset found that keeps the signature.
    fn shrink_samples(&mut self) -> Result<()> {
        let Some(drawn) = drawn_samples(&self.current, self.step, &self.opts.run)? else {
            return Ok(());
        };
        let mut kept = drawn;
        if !self.keeps(self.with_samples(&kept)) {
            return Ok(());
        }
        let mut n = 2;
        while kept.len() > 1 && !self.spent() {
            let size = kept.len().div_ceil(n);
            let chunks: Vec<Vec<usize>> = kept.chunks(size).map(<[usize]>::to_vec).collect();
            let mut reduced = false;
            // A chunk alone, then everything but a chunk.
            for (i, chunk) in chunks.iter().enumerate() {
                if self.spent() {
                    break;
                }
                if self.keeps(self.with_samples(chunk)) {
                    kept = chunk.clone();
                    n = 2;
                    reduced = true;
                    break;
                }
                if chunks.len() > 2 {
                    let rest: Vec<usize> = chunks
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != i)
                        .flat_map(|(_, c)| c.iter().copied())
                        .collect();
                    if self.spent() {
                        break;
                    }
                    if self.keeps(self.with_samples(&rest)) {
                        kept = rest;
                        n = (n - 1).max(2);
                        reduced = true;
                        break;
                    }
                }
            }
            if !reduced {
                if n >= kept.len() {
                    break;
                }
                n = (2 * n).min(kept.len());
            }
        }
        Ok(())
    }
}

/// The samples a case's run draws up to `step`, in first-drawn order
/// (`None` for synthetic data).
fn drawn_samples(case: &Case, step: usize, opts: &RunOptions) -> Result<Option<Vec<usize>>> {
    if case.data.source.sampling().is_none() {
        return Ok(None);
    }
    let source =
        crate::data::open_source(case, opts.dataset.as_ref(), opts.limits.max_memory_bytes)?;
    let mut seen = std::collections::BTreeSet::new();
    let mut order = Vec::new();
    for s in 0..=step.min(case.steps.saturating_sub(1)) {
        for i in source.batch(s, case.batch_size)?.samples {
            if seen.insert(i) {
                order.push(i);
            }
        }
    }
    Ok(Some(order))
}

/// "samples 1207 and 5531 of train.safetensors", for a case that names its samples.
fn samples_text(case: &Case) -> Option<String> {
    let indices = case.data.source.sampling()?.indices.as_ref()?;
    let name = match &case.data.source {
        SourceSpec::File(f) => f
            .path
            .file_name()
            .map_or(f.path.display().to_string(), |n| n.to_string_lossy().into()),
        SourceSpec::User { name, .. } => name.clone(),
        SourceSpec::Synthetic => return None,
    };
    Some(format!(
        "{} of {name}",
        crate::data::samples_phrase(indices)
    ))
}

/// Shrinks `case` while it keeps failing with its signature. `factory` is a
/// user model's factory (`None` for the built-in families). `None` when the
/// case does not fail at all; `Err(Rejected)` when it cannot run.
pub fn minimize(
    case: &Case,
    factory: Option<&dyn ModelFactory>,
    opts: &MinimizeOptions,
) -> Result<Option<Minimized>> {
    // The reproducer names the exact data: the file's hash goes in first.
    let case = &crate::data::pinned(case, opts.run.limits.max_memory_bytes)?;
    let (signature, step) = match run_candidate(case, factory, &opts.run)? {
        Outcome::Unstable { finding } => (finding.signature.clone(), finding.step),
        Outcome::Stable { .. } => return Ok(None),
        Outcome::Rejected { reason } => return Err(crate::error::Error::Rejected(reason)),
    };
    let mut search = Search {
        factory,
        opts,
        signature,
        current: case.clone(),
        step,
        runs: 1,
    };
    search.shrink_samples()?;
    let mut fixpoint = false;
    'passes: while !search.spent() {
        let mut changed = false;
        for candidate in candidates(&search.current, search.step) {
            if candidate.validate(&opts.run.limits).is_err() {
                continue;
            }
            if search.spent() {
                break 'passes;
            }
            if search.keeps(candidate) {
                changed = true;
                // The other candidates were made from the old case: start over.
                break;
            }
        }
        if !changed {
            fixpoint = true;
            break;
        }
    }
    let Search {
        current,
        signature,
        step,
        runs,
        ..
    } = search;
    Ok(Some(Minimized {
        before: measured_size(case, factory),
        after: measured_size(&current, factory),
        samples: samples_text(&current),
        case: current,
        signature,
        step,
        runs,
        fixpoint,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_custom_models_size_counts_the_parameters_its_factory_creates() {
        let mut case = Case::example("cnn").unwrap();
        case.model = ModelSpec::Custom(crate::spec::CustomSpec::new(
            "mlp",
            crate::spec::InputSpec::Vector { features: 8 },
            4,
        ));
        let factory =
            |vb: candle_nn::VarBuilder| -> candle_core::Result<Box<dyn crate::models::Model>> {
                let l = candle_nn::linear(8, 4, vb.pp("l"))?;
                Ok(Box::new(crate::models::ModuleModel(l)))
            };
        assert_eq!(CaseSize::of(&case).params, 0, "a spec alone cannot say");
        assert_eq!(measured_size(&case, Some(&factory)).params, 8 * 4 + 4);
    }

    #[test]
    fn round1_keeps_one_significant_digit() {
        assert_eq!(round1(0.0123), 0.01);
        assert_eq!(round1(3.7e-4), 4e-4);
        assert_eq!(round1(-250.0), -300.0);
        assert_eq!(round1(0.0), 0.0);
    }

    #[test]
    fn candidates_never_grow_a_case() {
        // The proposals themselves, before the guard that drops growth.
        let opts = crate::strategy::StrategyOptions::default();
        let mut proposed = 0;
        for seed in 0..30 {
            let c = crate::strategy::generate(&opts, seed);
            let size = CaseSize::of(&c);
            for n in proposals(&c, c.steps / 2) {
                let after = CaseSize::of(&n);
                assert!(after.within(&size), "seed {seed}: {size:?} -> {after:?}");
                proposed += 1;
            }
        }
        assert!(proposed > 30 * 5, "{proposed} proposals");
        // ... and the guard: a case grown along any axis is not within.
        let c = crate::spec::Case::example("cnn").unwrap();
        let size = CaseSize::of(&c);
        let mut longer = c.clone();
        longer.steps += 1;
        let mut wider = c.clone();
        wider.batch_size += 1;
        for grown in [longer, wider] {
            assert!(!CaseSize::of(&grown).within(&size));
        }
    }
}
