//! Safe learning-rate tables: for each configuration (family × size ×
//! optimizer × precision) and seed, the LR at which training first diverges
//! and first goes non-finite, found by bisection in log10(LR)
//! ([`search`]), beside the divergence LR that the curvature at
//! initialization predicts ([`curvature`]). Rendered by `render`.
//!
//! Seeds run in parallel, one compute thread each; the table is the same
//! for any number of workers.

pub mod curvature;
mod render;
pub mod search;

pub use curvature::{predicted_lr, sharpness, Curvature, CurvatureSettings};
pub use search::{Grid, Islands, Probe, Range, Threshold, VERIFY_DECADES};

use crate::error::{Error, Result};
use crate::finding::{FindingKind, Outcome};
use crate::models::{BuiltinFactory, ModelFactory};
use crate::probe::DivergenceTracker;
use crate::runner::RunOptions;
use crate::spec::{Case, OptimizerSpec, Precision, Size};
use crate::training::run_model;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Optimizer names `lr-table` accepts, with their hyperparameters.
pub const OPTIMIZERS: [&str; 5] = ["sgd", "momentum", "adam", "adamw", "rmsprop"];

/// The optimizers `lr-table` measures unless told otherwise.
pub const DEFAULT_OPTIMIZERS: &str = "sgd,adam,adamw";

/// The optimizer of a name in [`OPTIMIZERS`] (PyTorch's defaults; `momentum`
/// is SGD with momentum 0.9). The LR is set by the search.
pub fn optimizer_named(name: &str) -> Option<OptimizerSpec> {
    let sgd = |momentum| OptimizerSpec::Sgd {
        lr: 1e-3,
        momentum,
        nesterov: false,
        weight_decay: 0.0,
    };
    Some(match name {
        "sgd" => sgd(0.0),
        "momentum" => sgd(0.9),
        "adam" => OptimizerSpec::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        "adamw" => OptimizerSpec::Adamw {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        },
        "rmsprop" => OptimizerSpec::Rmsprop {
            lr: 1e-3,
            alpha: 0.99,
            eps: 1e-8,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        _ => return None,
    })
}

/// One row of the table: a labelled base case (its LR is ignored).
#[derive(Clone, Debug)]
pub struct Config {
    /// The model family.
    pub family: String,
    /// The size label (`default`, `large`).
    pub size: String,
    /// The optimizer's name in the table.
    pub optimizer: String,
    /// The base case.
    pub case: Case,
}

impl Config {
    /// The configurations of built-in families: every family × size ×
    /// optimizer × precision, from the family's example case.
    pub fn builtin(
        families: &[String],
        sizes: &[Size],
        optimizers: &[String],
        precisions: &[Precision],
    ) -> Result<Vec<Config>> {
        let mut out = Vec::new();
        for family in families {
            for &size in sizes {
                let base = Case::example_sized(family, size).ok_or_else(|| {
                    Error::option("family", format!("unknown built-in family `{family}`"))
                })?;
                for name in optimizers {
                    let optimizer = optimizer_named(name).ok_or_else(|| {
                        Error::option(
                            "optimizer",
                            format!("unknown optimizer `{name}`: expected one of {OPTIMIZERS:?}"),
                        )
                    })?;
                    for precision in precisions {
                        let mut case = base.clone();
                        case.optimizer = optimizer.clone();
                        case.precision = precision.clone();
                        out.push(Config {
                            family: family.clone(),
                            size: size.name().into(),
                            optimizer: name.clone(),
                            case,
                        });
                    }
                }
            }
        }
        Ok(out)
    }
}

/// How to measure.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LrTableOptions {
    /// Seeds per configuration (case seeds 0..seeds: weights and data).
    pub seeds: usize,
    /// Training steps per run.
    pub steps: usize,
    /// Bisection tolerance and grid step, in decades of LR.
    pub tolerance: f64,
    /// The search starts from [start_lo, start_hi] and widens within [min_lr, max_lr].
    pub start: (f64, f64),
    /// The lowest learning rate the search may reach.
    pub min_lr: f64,
    /// The highest learning rate the search may reach.
    pub max_lr: f64,
    /// Train every step on one batch (full-batch gradient descent).
    pub full_batch: bool,
    /// Estimate the sharpness at initialization and predict the divergence LR.
    pub curvature: bool,
    /// How the curvature is estimated.
    pub curvature_settings: CurvatureSettings,
    /// Worker threads (seeds run in parallel).
    pub jobs: usize,
    /// Where to report the seeds measured (none: nowhere).
    pub progress: Option<crate::progress::Reporter>,
    /// How each run runs.
    pub run: RunOptions,
}

impl Default for LrTableOptions {
    fn default() -> Self {
        LrTableOptions {
            seeds: 3,
            steps: 50,
            tolerance: 0.05,
            start: (1e-4, 1e-1),
            min_lr: 1e-8,
            max_lr: 1e3,
            full_batch: false,
            curvature: true,
            curvature_settings: CurvatureSettings::default(),
            jobs: 1,
            progress: None,
            run: RunOptions::default(),
        }
    }
}

impl LrTableOptions {
    /// Checks every option, naming the one out of range.
    pub fn validate(&self) -> Result<()> {
        let positive = |field: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Error::option(
                    field,
                    format!("must be positive and finite, got {v}"),
                ))
            }
        };
        positive("tolerance", self.tolerance)?;
        if self.tolerance > 1.0 {
            return Err(Error::option("tolerance", "must be at most 1 decade"));
        }
        for (field, v) in [
            ("min_lr", self.min_lr),
            ("max_lr", self.max_lr),
            ("start", self.start.0),
            ("start", self.start.1),
        ] {
            positive(field, v)?;
        }
        if self.min_lr >= self.max_lr {
            return Err(Error::option(
                "max_lr",
                format!("must be above min_lr ({} >= {})", self.min_lr, self.max_lr),
            ));
        }
        if !(self.min_lr <= self.start.0
            && self.start.0 < self.start.1
            && self.start.1 <= self.max_lr)
        {
            return Err(Error::option(
                "start",
                format!(
                    "need min_lr <= start_lo < start_hi <= max_lr, got {} <= {} < {} <= {}",
                    self.min_lr, self.start.0, self.start.1, self.max_lr
                ),
            ));
        }
        if self.seeds == 0 {
            return Err(Error::option("seeds", "must be at least 1"));
        }
        if self.steps == 0 {
            return Err(Error::option("steps", "must be at least 1"));
        }
        Ok(())
    }

    /// The learning-rate grid.
    pub fn grid(&self) -> Grid {
        Grid {
            tolerance: self.tolerance,
        }
    }

    /// Where the search starts and how far it may go.
    pub fn range(&self) -> Range {
        let g = self.grid();
        Range {
            start_lo: g.index(self.start.0),
            start_hi: g.index(self.start.1),
            floor: g.index(self.min_lr),
            ceil: g.index(self.max_lr),
        }
    }

    /// The case a seed runs (LR still to be set).
    pub fn seed_case(&self, base: &Case, seed: usize) -> Case {
        let mut case = base.clone();
        case.seed = base.seed + seed as u64;
        case.steps = self.steps;
        case.data.full_batch |= self.full_batch;
        case
    }
}

/// What one seed of one configuration showed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedResult {
    /// The case seed.
    pub seed: u64,
    /// The divergence threshold.
    pub divergence: Threshold,
    /// The non-finite threshold.
    pub non_finite: Threshold,
    /// Unstable LRs below the top transition (the threshold is the lowest).
    #[serde(default, skip_serializing_if = "Islands::is_empty")]
    pub divergence_islands: Islands,
    /// Unstable LRs below the non-finite threshold's top transition.
    #[serde(default, skip_serializing_if = "Islands::is_empty")]
    pub non_finite_islands: Islands,
    /// Training runs made.
    pub runs: usize,
    /// Runs a grid sweep of the same resolution would have made.
    pub grid_runs: usize,
    /// The sharpness at initialization, when estimated.
    pub curvature: Option<Curvature>,
}

/// A threshold over seeds: the median (the lower one for an even count)
/// and the extremes, each possibly outside the searched range.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// The median over seeds.
    pub median: Threshold,
    /// The lowest.
    pub min: Threshold,
    /// The highest.
    pub max: Threshold,
}

impl Spread {
    fn of(mut values: Vec<Threshold>) -> Option<Spread> {
        values.sort_by(|a, b| a.sort_key().total_cmp(&b.sort_key()));
        Some(Spread {
            median: *values.get((values.len().checked_sub(1)?) / 2)?,
            min: *values.first()?,
            max: *values.last()?,
        })
    }
}

/// The recommended LR: the largest 1-2-5 value at most a third of the
/// largest LR that was stable (did not diverge) on every seed.
pub const RECOMMENDATION_RULE: &str =
    "largest 1-2-5 value ≤ ⅓ × the largest LR that stayed stable (no divergence) on every seed";
const SAFETY: f64 = 3.0;

fn round_down_125(x: f64) -> f64 {
    let k = x.log10().floor();
    let base = 10f64.powf(k);
    let m = x / base;
    let m = if m >= 5.0 - 1e-9 {
        5.0
    } else if m >= 2.0 - 1e-9 {
        2.0
    } else {
        1.0
    };
    m * base
}

/// The recommended LR for these seeds (None when some seed diverged at
/// every LR searched).
pub fn recommend(seeds: &[SeedResult]) -> Option<f64> {
    let stable = seeds
        .iter()
        .map(|s| s.divergence.stable())
        .collect::<Option<Vec<f64>>>()?;
    let lowest = stable.into_iter().reduce(f64::min)?;
    Some(round_down_125(lowest / SAFETY))
}

/// One configuration's measurements.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The model family.
    pub family: String,
    /// The size label.
    pub size: String,
    /// The optimizer's name.
    pub optimizer: String,
    /// The precision's name.
    pub precision: String,
    /// Why the configuration could not run (then nothing else is set).
    pub error: Option<String>,
    /// Each seed's measurements.
    pub seeds: Vec<SeedResult>,
    /// The divergence threshold over seeds.
    pub divergence: Option<Spread>,
    /// The non-finite threshold over seeds.
    pub non_finite: Option<Spread>,
    /// The recommended learning rate ([`RECOMMENDATION_RULE`]).
    pub recommended_lr: Option<f64>,
    /// Median over seeds of the curvature's predicted divergence LR.
    pub predicted_lr: Option<f64>,
    /// Whether every seed's curvature estimate converged (None without
    /// curvature); an unconverged prediction is marked in every format.
    pub predicted_converged: Option<bool>,
    /// Whether every seed's curvature was the same at a ten times finer
    /// finite difference (None without curvature): a model with kinks
    /// gives a prediction marked "not smooth" in every format.
    #[serde(default)]
    pub predicted_smooth: Option<bool>,
    /// How the predicted LR is computed.
    pub prediction_rule: String,
    /// Median measured divergence LR (bracket middle) / predicted LR.
    pub measured_over_predicted: Option<f64>,
    /// Training runs made.
    pub runs: usize,
    /// Runs a grid sweep of the same resolution would have made.
    pub grid_runs: usize,
}

impl Row {
    fn new(config: &Config, seeds: std::result::Result<Vec<SeedResult>, String>) -> Row {
        let mut row = Row {
            family: config.family.clone(),
            size: config.size.clone(),
            optimizer: config.optimizer.clone(),
            precision: config.case.precision.name().into(),
            error: None,
            seeds: Vec::new(),
            divergence: None,
            non_finite: None,
            recommended_lr: None,
            predicted_lr: None,
            predicted_converged: None,
            predicted_smooth: None,
            prediction_rule: curvature::prediction_rule(&config.case.optimizer).into(),
            measured_over_predicted: None,
            runs: 0,
            grid_runs: 0,
        };
        let seeds = match seeds {
            Ok(s) => s,
            Err(e) => {
                row.error = Some(e);
                return row;
            }
        };
        row.divergence = Spread::of(seeds.iter().map(|s| s.divergence).collect());
        row.non_finite = Spread::of(seeds.iter().map(|s| s.non_finite).collect());
        row.recommended_lr = recommend(&seeds);
        row.predicted_lr = lower_median(
            seeds
                .iter()
                .filter_map(|s| s.curvature.as_ref()?.predicted_lr)
                .collect(),
        );
        let curvatures: Vec<&Curvature> =
            seeds.iter().filter_map(|s| s.curvature.as_ref()).collect();
        row.predicted_converged =
            (!curvatures.is_empty()).then(|| curvatures.iter().all(|c| c.converged));
        row.predicted_smooth =
            (!curvatures.is_empty()).then(|| curvatures.iter().all(|c| c.smooth));
        let measured = lower_median(
            seeds
                .iter()
                .filter_map(|s| s.divergence.estimate())
                .collect(),
        );
        row.measured_over_predicted = match (measured, row.predicted_lr) {
            (Some(m), Some(p)) => Some(m / p),
            _ => None,
        };
        row.runs = seeds.iter().map(|s| s.runs).sum();
        row.grid_runs = seeds.iter().map(|s| s.grid_runs).sum();
        row.seeds = seeds;
        row
    }
}

fn lower_median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len().checked_sub(1)? / 2).copied()
}

/// The settings a table was measured with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Seeds per configuration.
    pub seeds: usize,
    /// Training steps per run.
    pub steps: usize,
    /// The grid step, in decades of LR.
    pub tolerance_decades: f64,
    /// The lowest LR searched.
    pub min_lr: f64,
    /// The highest LR searched.
    pub max_lr: f64,
    /// Whether every step trained on one batch.
    pub full_batch: bool,
    /// The divergence rule, in words.
    pub divergence: String,
    /// How the recommended LR is chosen.
    pub recommendation_rule: String,
}

/// A measured table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LrTable {
    /// How it was measured.
    pub settings: Settings,
    /// One row per configuration.
    pub rows: Vec<Row>,
    /// Training runs made by the searches, in all.
    pub runs: usize,
    /// Training runs a grid sweep of the same resolution over the same
    /// ranges would have made.
    pub grid_runs: usize,
}

/// Trains `case` at the grid's LR and says whether it diverged / went non-finite.
pub fn probe_at(
    case: &Case,
    lr: f64,
    factory: &dyn ModelFactory,
    opts: &RunOptions,
) -> Result<Probe> {
    let mut case = case.clone();
    case.optimizer.set_lr(lr);
    let opts = RunOptions {
        watch_divergence: false,
        fidelity: false,
        dump: None,
        ..opts.clone()
    };
    match run_model(&case, factory, &opts)? {
        Outcome::Stable { trace } => {
            // Diverged: crossed the line and had not recovered by the end,
            // so every loss is pushed before the tracker is asked.
            let mut tracker = DivergenceTracker::new(case.divergence_factor);
            for &l in &trace.losses {
                tracker.push(l);
            }
            let diverged = tracker.still_diverged();
            Ok(Probe {
                non_finite: false,
                diverged,
            })
        }
        Outcome::Unstable { finding } => match finding.kind {
            FindingKind::Nan
            | FindingKind::Inf
            | FindingKind::Overflow
            | FindingKind::ScaleCollapse => Ok(Probe {
                non_finite: true,
                diverged: true,
            }),
            _ => Err(Error::invalid(
                "data",
                format!(
                    "the run fails for a reason other than the learning rate: {}",
                    finding.detail
                ),
            )),
        },
        Outcome::Rejected { reason } => Err(Error::Rejected(reason)),
    }
}

/// Measures one seed of a configuration: both thresholds, and the curvature.
pub fn measure_seed(
    base: &Case,
    seed: usize,
    factory: &dyn ModelFactory,
    opts: &LrTableOptions,
) -> Result<SeedResult> {
    let case = opts.seed_case(base, seed);
    let grid = opts.grid();
    let curvature = if opts.curvature {
        Some(sharpness(
            &case,
            factory,
            &opts.run,
            &opts.curvature_settings,
        )?)
    } else {
        None
    };
    let searched = search::search(grid, opts.range(), &mut |i| {
        probe_at(&case, grid.lr(i), factory, &opts.run)
    })?;
    Ok(SeedResult {
        seed: case.seed,
        divergence: searched.divergence,
        non_finite: searched.non_finite,
        divergence_islands: searched.divergence_islands,
        non_finite_islands: searched.non_finite_islands,
        runs: searched.runs,
        grid_runs: searched.grid_runs,
        curvature,
    })
}

/// Measures every configuration. `factory` builds the model of `custom`
/// configurations (users' own families); built-in families need none.
pub fn measure(
    configs: &[Config],
    factory: Option<&dyn ModelFactory>,
    opts: &LrTableOptions,
) -> Result<LrTable> {
    opts.validate()?;
    let builtins: Vec<Option<BuiltinFactory>> = configs
        .iter()
        .map(|c| BuiltinFactory::new(&c.case.model))
        .collect();
    for (c, b) in configs.iter().zip(&builtins) {
        let registered = crate::models::registered_for(&c.case).is_some();
        if b.is_none() && factory.is_none() && !registered {
            return Err(Error::invalid(
                "model.family",
                format!(
                    "configuration `{}` has a custom model: pass its factory",
                    c.family
                ),
            ));
        }
    }
    let items: Vec<(usize, usize)> = (0..configs.len())
        .flat_map(|c| (0..opts.seeds).map(move |s| (c, s)))
        .collect();
    let results: Mutex<Vec<Option<Result<SeedResult>>>> =
        Mutex::new(items.iter().map(|_| None).collect());
    let progress = crate::progress::or_silent(&opts.progress);
    progress.start(Some(items.len() as u64));
    let done = AtomicUsize::new(0);
    let jobs = opts.jobs.max(1).min(items.len().max(1));
    crate::parallel::run(jobs, |queue| {
        loop {
            let k = queue.take() as usize;
            let Some(&(c, seed)) = items.get(k) else {
                return Ok(());
            };
            let config = &configs[c];
            // A built-in family's own factory first, then the caller's or
            // the registered model's.
            let factory: &dyn ModelFactory = match &builtins[c] {
                Some(b) => b,
                None => crate::models::factory_for(&config.case, factory, &None)?,
            };
            // A seed's error is its row's, not the table's.
            let r = measure_seed(&config.case, seed, factory, opts);
            let status = match &r {
                Ok(s) => format!(
                    "{} {} {}: {} runs",
                    config.family,
                    config.optimizer,
                    config.case.precision.name(),
                    s.runs
                ),
                Err(_) => String::new(),
            };
            progress.update(done.fetch_add(1, Ordering::SeqCst) as u64 + 1, &status);
            results.lock().expect("no worker panics")[k] = Some(r);
        }
    })?;
    progress.finish();
    let mut results = results.into_inner().expect("no worker panics").into_iter();
    let mut rows = Vec::new();
    for config in configs {
        let mut seeds = Ok(Vec::new());
        for _ in 0..opts.seeds {
            match results.next().flatten().expect("every item ran") {
                Ok(s) => {
                    if let Ok(v) = &mut seeds {
                        v.push(s);
                    }
                }
                // A configuration the case rules reject becomes a row that
                // says why; anything else is an error of the whole table.
                Err(e @ (Error::InvalidCase { .. } | Error::Rejected(_))) => {
                    if seeds.is_ok() {
                        seeds = Err(e.to_string());
                    }
                }
                Err(e) => return Err(e),
            }
        }
        rows.push(Row::new(config, seeds));
    }
    Ok(LrTable {
        settings: Settings {
            seeds: opts.seeds,
            steps: opts.steps,
            tolerance_decades: opts.tolerance,
            min_lr: opts.min_lr,
            max_lr: opts.max_lr,
            full_batch: opts.full_batch,
            divergence: format!(
                "smoothed loss > {} × its best within {} steps, and at the end still above the best it had when it crossed",
                configs.first().map_or(4.0, |c| c.case.divergence_factor),
                opts.steps
            ),
            recommendation_rule: RECOMMENDATION_RULE.into(),
        },
        runs: rows.iter().map(|r| r.runs).sum(),
        grid_runs: rows.iter().map(|r| r.grid_runs).sum(),
        rows,
    })
}

#[cfg(test)]
mod tests;
