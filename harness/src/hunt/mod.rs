//! `hunt`: the trigger search for latent NaNs — the ones training on the
//! data has not fired yet.
//!
//! 1. Train the case, reading at checkpoints how close every risky stage
//!    came to its op's unsafe domain (its margin, `risk`): a log's input
//!    to 0, an exp's output to the dtype's largest value, a root's input to
//!    0, a norm's row to all zeros, a division or a half-precision
//!    accumulation to the range's end. A stage is risky by the op kind it
//!    declares (or, marked, by its name).
//! 2. From the trained state, search inputs within a stated bound of a
//!    training batch (multiples of the data's largest magnitude, growing)
//!    that drive each risky stage across, by its pressure's gradient
//!    with respect to the input (`search.rs`); for token ids, swaps of the
//!    tokens guided by that gradient at the embedding stage (`tokens.rs`);
//!    then a plausible drift of the weights (a few steps at a higher
//!    learning rate).
//! 3. Confirm every candidate with the step engine: a trigger is an
//!    ordinary finding (localized and explained), minimized to the fewest
//!    rows that still fire it and written as a scene that replays without
//!    any search (`nanhunt replay DIR`, `regression::assert_dir_reproduces`).
//!
//! The [`RiskReport`] says, stage by stage, its margin in training and
//! whether it fired on the data, was triggered (by what perturbation), or
//! held within the bound.

mod report;
mod search;
mod tokens;

pub use report::{RiskReport, RiskStatus, StageRisk, Trigger, TriggerKind};

use crate::error::Result;
use crate::finding::{Finding, OpKind, OpSite};
use crate::models::graph::OpGraph;
use crate::models::{ModelFactory, Record, Tracer};
use crate::rules::{OpRule, View};
use crate::runner::{RunOptions, Session};
use crate::spec::{Case, SourceSpec};
use search::{Found, Ground, Search, Target};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokens::TokenSearch;

/// How a hunt searches. Built from `HuntOptions::default()`; fields may be
/// added (`#[non_exhaustive]`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct HuntOptions {
    /// The perturbations tried, in multiples of the data's scale (its
    /// largest magnitude), smallest first; the last is the bound.
    pub bounds: Vec<f64>,
    /// Sign-gradient steps per start inside each ball.
    pub pgd_steps: usize,
    /// Token inputs: the most tokens swapped per row (one per round,
    /// guided by the gradient through the embedding).
    pub token_swaps: usize,
    /// Learning-rate factors of the weight-drift search (empty: none).
    pub drift_factors: Vec<f64>,
    /// Steps of each drift.
    pub drift_steps: usize,
    /// Margins are read at this many checkpoints of training.
    pub checkpoints: usize,
    /// Write each trigger's reproducer (a scene) under this directory.
    pub out: Option<PathBuf>,
    /// How each training run runs.
    pub run: RunOptions,
    /// The whole hunt's wall-clock budget: stages not searched when it
    /// runs out are reported as such.
    pub budget: Option<Duration>,
    /// The longest one stage's search (or one drift) may take: one cut
    /// off is reported as not searched to the bound.
    pub stage_timeout: Option<Duration>,
}

impl Default for HuntOptions {
    fn default() -> Self {
        HuntOptions {
            bounds: vec![0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0],
            pgd_steps: 8,
            token_swaps: 16,
            drift_factors: vec![3.0, 10.0],
            drift_steps: 5,
            checkpoints: 4,
            out: None,
            run: RunOptions::default(),
            budget: None,
            stage_timeout: None,
        }
    }
}

impl HuntOptions {
    /// Perturbations up to `bound` × the data's scale.
    pub fn up_to(mut self, bound: f64) -> Self {
        self.bounds.retain(|&b| b < bound);
        self.bounds.push(bound);
        self
    }

    /// The largest perturbation searched, as a multiple of the data's scale.
    pub fn bound(&self) -> f64 {
        self.bounds.last().copied().unwrap_or(0.0)
    }

    /// The hunt stops searching after `budget`, and each stage's search
    /// after `stage` (see the fields).
    pub fn within(mut self, budget: Option<Duration>, stage: Option<Duration>) -> Self {
        self.budget = budget;
        self.stage_timeout = stage;
        self
    }

    /// Reproducers written under `dir`.
    pub fn out_to(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out = Some(dir.into());
        self
    }

    /// No weight-drift search.
    pub fn without_drift(mut self) -> Self {
        self.drift_factors.clear();
        self
    }
}

/// A risky stage (or op) as training saw it.
struct Seen {
    op: crate::finding::StageOp,
    rule: &'static dyn OpRule,
    site: Option<OpSite>,
    margin: Option<f64>,
}

/// What training saw of the model's records: its risky stages and ops,
/// and how many recorded ops of each kind have no unsafe domain in the
/// dtype they compute in.
#[derive(Default)]
struct Survey {
    risky: BTreeMap<String, Seen>,
    safe: BTreeMap<String, usize>,
    /// Ops counted once, by name, over the passes.
    counted: std::collections::BTreeSet<String>,
}

/// Hunts the latent NaNs of `case`'s model (see the module docs).
///
/// ```no_run
/// use nanhunt::hunt::{hunt, HuntOptions};
/// use nanhunt::models::BuiltinFactory;
/// let case = nanhunt::Case::example("cnn").expect("a built-in family");
/// let factory = BuiltinFactory::new(&case.model).expect("a built-in family");
/// let report = hunt(&case, &factory, &HuntOptions::default().out_to("hunt-out"))?;
/// println!("{}", report.to_markdown());
/// # Ok::<(), nanhunt::Error>(())
/// ```
pub fn hunt(case: &Case, factory: &dyn ModelFactory, opts: &HuntOptions) -> Result<RiskReport> {
    let quiet = RunOptions {
        dump: None,
        dump_at: None,
        fidelity: false,
        ..opts.run.clone()
    };
    let mut session = Session::new(case, factory, &quiet)?;
    let (seen, fired, read) = train(&mut session, opts.checkpoints)?;
    let ground = ground(case, factory, &quiet, &session, fired.as_ref())?;
    session.restore(&ground.snapshot)?;
    let end = opts.budget.map(|b| Instant::now() + b);
    let mut search = Search {
        session: &session,
        ground: &ground,
        evaluations: read,
        pgd_steps: opts.pgd_steps,
        deadline: None,
        cut: false,
    };
    let mut credits = Credits::default();
    if let Some(f) = &fired {
        credits.fired_on_data(f);
    }
    let targets = targets(&seen.risky, &credits.status);
    let bound = opts.bounds.last().copied().unwrap_or(0.0);
    for t in &targets {
        if credits.status.contains_key(&t.stage) {
            continue;
        }
        if end.is_some_and(|e| Instant::now() >= e) {
            credits.not_searched(t, BUDGET_SPENT);
            continue;
        }
        search.time_box(end, opts.stage_timeout);
        let Some(found) = search_target(&mut search, t, opts, &mut credits)? else {
            if search.cut {
                credits.not_searched(t, SEARCH_CUT);
            }
            continue;
        };
        credits.found(&ground, found, t, fired.as_ref(), opts.out.as_deref())?;
    }
    let Credits { mut status, owners } = credits;
    if end.is_none_or(|e| Instant::now() < e) {
        drift(case, &ground, opts, &targets, &mut status)?;
    }
    let (stages, unsafe_free) =
        report_stages(seen, status, &owners, bound, opts.token_swaps, &ground);
    Ok(RiskReport {
        model: case.family().to_string(),
        dataset: dataset_name(case),
        steps: fired.as_ref().map_or(case.steps, |f| f.step),
        scale: match &ground.batch.input {
            crate::data::HostInput::Real { values, .. } => search::data_scale(values),
            crate::data::HostInput::Tokens { .. } => 1.0,
        },
        bound,
        token_swaps: tokens_in(&ground).then_some(opts.token_swaps),
        stages,
        unsafe_free,
        evaluations: search.evaluations,
    }
    .rounded())
}

/// What the hunt credits to each stage, and what each credited finding
/// names (for a stage that was no target).
#[derive(Default)]
struct Credits {
    status: BTreeMap<String, RiskStatus>,
    owners: BTreeMap<String, Owner>,
}

impl Credits {
    /// The data itself failed at `f`'s stage.
    fn fired_on_data(&mut self, f: &Finding) {
        let at = fired_at(f).to_string();
        self.owners.insert(at.clone(), Owner::of(f));
        self.status.insert(
            at,
            RiskStatus::FiredOnData {
                step: f.step,
                signature: f.signature.slug(),
            },
        );
    }

    fn not_searched(&mut self, t: &Target, why: &str) {
        let why = why.to_string();
        self.status
            .insert(t.stage.clone(), RiskStatus::NotSearched { why });
    }

    /// A trigger found while searching `t`, credited to the op whose
    /// finding it is, whichever was searched; its reproducer written under
    /// `out`.
    fn found(
        &mut self,
        ground: &Ground,
        mut found: Found,
        t: &Target,
        fired: Option<&Finding>,
        out: Option<&Path>,
    ) -> Result<()> {
        // The data itself fires first: no perturbation is needed, and the
        // finding is the data's, not this target's.
        if let Some(f) = fired.filter(|f| f.signature == found.finding.signature) {
            let why = format!(
                "the training data fires `{}` at this step before any perturbation",
                fired_at(f)
            );
            self.not_searched(t, &why);
            return Ok(());
        }
        let at = fired_at(&found.finding).to_string();
        // A stage keeps its first status; a trigger without a reproducer
        // may be replaced by one with. Its directory is the same (the
        // signature's): writing it again would undo the first.
        let open = match self.status.get(&at) {
            None => true,
            Some(RiskStatus::Triggered(t)) => t.reproducer.is_none(),
            Some(_) => false,
        };
        if open {
            search::minimize_rows(ground, &mut found)?;
            let trigger = input_trigger(ground, &found, out)?;
            let better = !matches!(&trigger, RiskStatus::Triggered(t) if t.reproducer.is_none())
                || !self.status.contains_key(&at);
            if better {
                self.status.insert(at.clone(), trigger);
            }
        }
        self.owners
            .entry(at.clone())
            .or_insert_with(|| Owner::of(&found.finding));
        if at != t.stage && !self.status.contains_key(&t.stage) {
            self.status
                .insert(t.stage.clone(), RiskStatus::FiredElsewhere { first: at });
        }
        Ok(())
    }
}

/// The search of target `t`: by token swaps for a model that reads token
/// ids, else by perturbations of the inputs; a target its kind cannot
/// search is credited "not searched" with why.
fn search_target(
    search: &mut Search,
    t: &Target,
    opts: &HuntOptions,
    credits: &mut Credits,
) -> Result<Option<Found>> {
    if tokens_in(search.ground) {
        return Ok(match search.tokens(t, opts.token_swaps)? {
            TokenSearch::Found(found) => Some(*found),
            TokenSearch::NotFound => None,
            TokenSearch::NoEmbedding => {
                credits.not_searched(
                    t,
                    "no recorded stage holds rows of a trainable embedding table at the token ids",
                );
                None
            }
        });
    }
    if let Some(why) = t.rule.not_searched() {
        credits.not_searched(t, why);
        return Ok(None);
    }
    search.input(t, &opts.bounds)
}

/// Why a stage the budget left no time for was not searched.
const BUDGET_SPENT: &str = "the hunt's time budget ran out before its search";
/// Why a stage whose search ran out of time was not searched to the bound.
const SEARCH_CUT: &str =
    "its search ran out of time (the hunt's budget or the stage's timeout) before the bound";

/// The op a credited finding names.
struct Owner {
    op: Option<crate::finding::StageOp>,
    site: Option<OpSite>,
}

impl Owner {
    fn of(f: &Finding) -> Owner {
        let site = f
            .explanation
            .as_ref()
            .and_then(|e| e.site.clone())
            .or_else(|| f.site.clone());
        Owner {
            op: site
                .as_ref()
                .map(|s| crate::finding::StageOp::declared(s.kind))
                .or(f.op),
            site,
        }
    }
}

/// What training left: the risky stages seen (with their least margin),
/// its finding if it failed, and the traced passes it took.
type Trained = (Survey, Option<Finding>, usize);

/// Where a finding is: the op or stage it names (its explanation's, which
/// for a mask is the softmax after it).
fn fired_at(f: &Finding) -> &str {
    f.explanation.as_ref().map_or(&f.stage, |e| &e.stage)
}

/// Trains the case to its end (or its first finding), reading the risky
/// stages' margins at the checkpoints.
fn train(session: &mut Session, checkpoints: usize) -> Result<Trained> {
    let steps = session.case().steps;
    let every = (steps / checkpoints.max(1)).max(1);
    let (mut seen, mut read) = (Survey::default(), 0);
    for step in 0..steps {
        if step % every == 0 {
            read_margins(session, step, &mut seen)?;
            read += 1;
        }
        if let Some(f) = session.step(step)? {
            return Ok((seen, Some(f), read));
        }
    }
    read_margins(session, steps - 1, &mut seen)?;
    Ok((seen, None, read + 1))
}

/// A traced forward pass on the batch of `step`: the margin of every
/// risky stage or op, kept when it is the least so far, and the count of
/// the ops without an unsafe domain.
fn read_margins(session: &Session, step: usize, seen: &mut Survey) -> Result<()> {
    let batch = session.batch_unchecked(step)?;
    let mut tracer = Tracer::on();
    let shared = crate::models::tracer::share(&tracer);
    let forward = session.forward_loss(&batch, &mut tracer);
    drop(shared);
    let forward = forward?;
    let records: Vec<Record> = tracer.records().clone();
    let g = OpGraph::new(&records);
    for (i, r) in records.iter().enumerate() {
        let Some(op) = r.stage_op() else { continue };
        let Some(rule) = crate::rules::risk(op.kind, r.output.dtype()) else {
            if r.site.is_some() && seen.counted.insert(r.name.clone()) {
                *seen.safe.entry(op.kind.to_string()).or_insert(0) += 1;
            }
            continue;
        };
        let margin = rule.margin(&View::of(&g, i, &forward.input))?;
        let entry = seen.risky.entry(r.name.clone()).or_insert(Seen {
            op,
            rule,
            site: r.site.clone(),
            margin,
        });
        entry.margin = match (entry.margin, margin) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(())
}

/// The state the search starts from: the trained one, or the one before
/// the failing step when training failed; the batch of that step.
fn ground<'a>(
    case: &Case,
    factory: &'a dyn ModelFactory,
    opts: &RunOptions,
    session: &Session,
    fired: Option<&Finding>,
) -> Result<Ground<'a>> {
    let (snapshot, step) = match (fired, session.failed_before()) {
        (Some(f), Some(before)) => (before.clone(), f.step),
        _ => (session.snapshot()?, case.steps),
    };
    let batch = session.batch_unchecked(step)?;
    let mut replay = case.clone();
    replay.steps = step + 1;
    // The saved batch is what the model saw: nothing is applied again.
    replay.data.pathologies.clear();
    replay.augment.clear();
    Ok(Ground {
        case: replay,
        origin: case.clone(),
        factory,
        opts: opts.clone(),
        snapshot,
        history: session.trace().clone(),
        step,
        batch,
    })
}

/// The stages to search, the least margin first.
fn targets(seen: &BTreeMap<String, Seen>, status: &BTreeMap<String, RiskStatus>) -> Vec<Target> {
    let mut out: Vec<(&String, &Seen)> = seen
        .iter()
        .filter(|(n, _)| !status.contains_key(*n))
        .collect();
    out.sort_by(|a, b| {
        let m = |s: &Seen| s.margin.unwrap_or(f64::INFINITY);
        m(a.1).total_cmp(&m(b.1)).then(a.0.cmp(b.0))
    });
    out.into_iter()
        .map(|(stage, s)| Target {
            stage: stage.clone(),
            rule: s.rule,
        })
        .collect()
}

/// The risky stage a finding names, if it is one of the targets.
fn stage_of<'t>(f: &Finding, targets: &'t [Target]) -> Option<&'t str> {
    targets
        .iter()
        .find(|t| search::names(f, &t.stage))
        .map(|t| t.stage.as_str())
}

/// The reproducer's directory of a finding under `out`.
fn reproducer_dir(out: &Path, f: &Finding) -> PathBuf {
    out.join(f.signature.slug())
}

/// An input trigger: its reproducer written (when asked for), its status.
fn input_trigger(ground: &Ground, found: &Found, out: Option<&Path>) -> Result<RiskStatus> {
    let dir = out.map(|o| reproducer_dir(o, &found.finding));
    // Listed with a reproducer only when its step fails again from the
    // same state and the scene written replays.
    let again = ground
        .fire(&found.batch, dir.as_deref())?
        .is_some_and(|f| f.signature == found.finding.signature);
    let unreproducible = match (again, &dir) {
        (false, _) => Some(format!("{UNREPRODUCIBLE}; {}", crate::finding::SEED_THEM)),
        (true, Some(d)) => {
            let replayed = crate::replay::replay_scene(d, Some(ground.factory), &ground.opts);
            match replayed {
                Ok(r) if r.reproduced() => None,
                Ok(r) => Some(format!("its scene does not replay: {}", r.message)),
                Err(e) => Some(format!("its scene does not replay: {e}")),
            }
        }
        (true, None) => None,
    };
    let dir = match (dir, &unreproducible) {
        (Some(d), Some(_)) => {
            // A scene that does not replay is no reproducer.
            let _ = std::fs::remove_dir_all(&d);
            None
        }
        (d, _) => d,
    };
    let rows = found.rows.len();
    let by = if tokens_in(ground) {
        TriggerKind::Tokens {
            swapped: tokens::changed(&ground.batch, found),
            rows,
        }
    } else {
        TriggerKind::Input {
            perturbation: found.perturbation,
            rows,
        }
    };
    Ok(RiskStatus::Triggered(Box::new(Trigger {
        by,
        signature: found.finding.signature.slug(),
        explanation: found
            .finding
            .explanation
            .as_ref()
            .map(|e| e.sentence.clone()),
        reproducer: dir.map(|d| file_name(&d)),
        unreproducible,
    })))
}

/// Why a confirmed trigger has no reproducer when its step passes the
/// second time from the same state.
const UNREPRODUCIBLE: &str = "its step did not fail again from the same state: the model draws unseeded random numbers (candle's dropout?)";

fn file_name(dir: &Path) -> String {
    dir.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// Weight drift for the stages still without a trigger: a few steps at a
/// higher learning rate on the training data.
fn drift(
    case: &Case,
    ground: &Ground,
    opts: &HuntOptions,
    targets: &[Target],
    status: &mut BTreeMap<String, RiskStatus>,
) -> Result<()> {
    // Written beside the reproducers (one file system: a rename moves it),
    // under a temp name that the next hunt removes if this one is killed.
    let scratch = match &opts.out {
        Some(out) => crate::files::temp_path(&out.join("drift")),
        None => std::env::temp_dir().join(format!("nanhunt-drift-{}", std::process::id())),
    };
    for &factor in &opts.drift_factors {
        if targets.iter().all(|t| status.contains_key(&t.stage)) {
            break;
        }
        let dir = scratch.join(format!("{factor}"));
        let Some(f) = search::drift(case, ground, factor, opts.drift_steps, &dir)? else {
            continue;
        };
        let Some(stage) = stage_of(&f, targets).filter(|s| !status.contains_key(*s)) else {
            let _ = std::fs::remove_dir_all(&dir);
            continue;
        };
        let reproducer = match &opts.out {
            Some(out) => {
                let to = reproducer_dir(out, &f);
                crate::files::replace_dir(&dir, &to)?;
                Some(file_name(&to))
            }
            None => None,
        };
        let _ = std::fs::remove_dir_all(&dir);
        status.insert(
            stage.to_string(),
            RiskStatus::Triggered(Box::new(Trigger {
                by: TriggerKind::WeightDrift {
                    lr_factor: factor,
                    steps: opts.drift_steps,
                },
                signature: f.signature.slug(),
                explanation: f.explanation.as_ref().map(|e| e.sentence.clone()),
                reproducer,
                unreproducible: None,
            })),
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// Every risky stage with its margin and what was found there, and the
/// stages that fired without being risky (a finding credited to its own op);
/// with the count, by kind, of the recorded ops not searched.
fn report_stages(
    seen: Survey,
    mut status: BTreeMap<String, RiskStatus>,
    owners: &BTreeMap<String, Owner>,
    bound: f64,
    swaps: usize,
    ground: &Ground,
) -> (Vec<StageRisk>, BTreeMap<String, usize>) {
    let tokens = tokens_in(ground);
    let mut out: Vec<StageRisk> = seen
        .risky
        .into_iter()
        .map(|(stage, s)| {
            let status = status.remove(&stage).unwrap_or(if tokens {
                RiskStatus::NoTokenTrigger { swaps }
            } else {
                RiskStatus::NoTrigger { bound }
            });
            StageRisk {
                op: s.op.kind,
                op_from_name: s.op.guessed(),
                risk: s.rule.id().to_string(),
                domain: s.rule.domain().to_string(),
                site: s.site,
                margin: s.margin,
                status,
                stage,
            }
        })
        .collect();
    // The stages that fired without an unsafe domain of their own: rows,
    // and no longer counted as "not searched".
    let mut unsafe_free = seen.safe;
    for (stage, status) in status {
        let owner = owners.get(&stage);
        let op = owner.and_then(|o| o.op).map_or(OpKind::Other, |op| op.kind);
        let site = owner.and_then(|o| o.site.clone());
        if let Some(n) = unsafe_free.get_mut(op.as_str()).filter(|_| site.is_some()) {
            *n = n.saturating_sub(1);
        }
        out.push(StageRisk {
            op,
            op_from_name: owner.and_then(|o| o.op).is_some_and(|op| op.guessed()),
            risk: "none".into(),
            domain: "no unsafe domain of its own".into(),
            site,
            margin: None,
            status,
            stage,
        });
    }
    unsafe_free.retain(|_, n| *n > 0);
    out.sort_by(|a, b| a.stage.cmp(&b.stage));
    (out, unsafe_free)
}

/// Whether the model reads token ids.
fn tokens_in(ground: &Ground) -> bool {
    matches!(ground.batch.input, crate::data::HostInput::Tokens { .. })
}

/// The case's data in words.
fn dataset_name(case: &Case) -> String {
    match &case.data.source {
        SourceSpec::File(f) => f.path.display().to_string(),
        SourceSpec::User { name, .. } => format!("user dataset `{name}`"),
        SourceSpec::Synthetic => format!("synthetic (scale {})", case.data.scale),
    }
}
