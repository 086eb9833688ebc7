//! What a hunt costs against training the same model the same number of
//! steps, as a ratio measured in one run: `nanhunt::run_model` on the case
//! (the probe on, as `nanhunt run` trains) against `hunt::hunt` with its
//! default bound and searches, runs interleaved, medians compared. Each
//! built-in family at its example size and two user models: one with a
//! latent bug (RMS without an eps: the search stops at its trigger) and
//! its repair (nothing to find: the whole search is spent).
//! Run: `cargo bench -p nanhunt --bench hunt_cost`
//! (RAYON_NUM_THREADS=1 for the single-thread figure; names filter).

use candle_core::{Module, Tensor, D};
use candle_nn::{linear, Linear, VarBuilder};
use nanhunt::hunt::{hunt, HuntOptions, RiskStatus};
use nanhunt::models::{BuiltinFactory, Model, ModelFactory, Tracer};
use nanhunt::spec::{CustomSpec, InputSpec, ModelSpec, FAMILIES};
use nanhunt::{Case, OpKind, Outcome, RunOptions};
use std::time::Instant;

const ROUNDS: usize = 3;

struct RmsMlp {
    hidden: Linear,
    head: Linear,
    eps: f64,
}

impl Model for RmsMlp {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let rms = (x.sqr()?.mean_keepdim(D::Minus1)? + self.eps)?.sqrt()?;
        let x = tr.record_as("rms_norm", OpKind::Norm, x.broadcast_div(&rms)?)?;
        let h = tr.record("hidden", self.hidden.forward(&x)?.relu()?)?;
        tr.record("head", self.head.forward(&h)?)
    }
}

fn rms_mlp(eps: f64) -> impl ModelFactory {
    move |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(RmsMlp {
            hidden: linear(16, 32, vb.pp("hidden"))?,
            head: linear(32, 4, vb.pp("head"))?,
            eps,
        }))
    }
}

fn user_case(name: &str) -> Case {
    let mut case = Case::example("cnn").expect("built-in example");
    case.model = ModelSpec::Custom(CustomSpec::new(name, InputSpec::Vector { features: 16 }, 4));
    case.steps = 30;
    case
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn measure(name: &str, case: &Case, factory: &dyn ModelFactory) {
    let opts = HuntOptions::default();
    let (mut train, mut search) = (Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let outcome = nanhunt::run_model(case, factory, &RunOptions::default()).expect("trains");
        train.push(start.elapsed().as_secs_f64() * 1e3);
        assert!(!matches!(outcome, Outcome::Rejected { .. }), "{name}");
        let start = Instant::now();
        last = Some(hunt(case, factory, &opts).expect("hunts"));
        search.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let report = last.expect("at least one round");
    let triggered = report
        .stages
        .iter()
        .filter(|s| matches!(s.status, RiskStatus::Triggered(_)))
        .count();
    let (t, h) = (median(&mut train), median(&mut search));
    println!(
        "{name:16} {:>6} {:>11.1} {:>11.1} {:>7.1}x {:>7} {:>6} {:>9}",
        case.steps,
        t,
        h,
        h / t,
        report.stages.len(),
        triggered,
        report.evaluations
    );
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    nanhunt::device::retain_freed_memory();
    println!(
        "{:16} {:>6} {:>11} {:>11} {:>8} {:>7} {:>6} {:>9}",
        "model", "steps", "train ms", "hunt ms", "ratio", "risky", "found", "passes"
    );
    for family in FAMILIES {
        if !wanted(family) {
            continue;
        }
        let case = Case::example(family).expect("built-in example");
        let factory = BuiltinFactory::new(&case.model).expect("a built-in family");
        measure(family, &case, &factory);
    }
    for (name, eps) in [("rms_no_eps", 0.0), ("rms_eps", 1e-6)] {
        if wanted(name) {
            measure(name, &user_case(name), &rms_mlp(eps));
        }
    }
}
