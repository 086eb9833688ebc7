//! `diagnose` names the right root cause first, with a verified fix, for
//! each of six different causes.

use crate::support::*;
use nanhunt::diagnose::{diagnose, CauseKind, Diagnosis};
use nanhunt::models::BuiltinFactory;
use nanhunt::spec::*;
use nanhunt::RunOptions;

fn diagnosis(mut case: Case) -> Diagnosis {
    case.steps = 20;
    let factory = BuiltinFactory::new(&case.model).unwrap();
    diagnose(&case, &factory, &RunOptions::default()).unwrap()
}

fn assert_first(d: &Diagnosis, kind: CauseKind) {
    let first = &d.causes[0];
    assert_eq!(
        first.kind,
        kind,
        "ranked: {:?}",
        d.causes
            .iter()
            .map(|c| (c.kind, c.score))
            .collect::<Vec<_>>()
    );
    assert!(first.verified(), "{:?}", first.fixes);
    let fix = first.fixes.iter().find(|f| f.verified).unwrap();
    assert!(!fix.changes.is_empty(), "a verified fix is a changed case");
    assert!(!first.evidence.is_empty(), "the cause comes with evidence");
}

fn raw_cnn() -> Case {
    let mut c = Case::example("cnn").unwrap();
    let ModelSpec::Cnn(m) = &mut c.model else {
        unreachable!()
    };
    for b in &mut m.blocks {
        b.batch_norm_eps = None;
    }
    c
}

#[test]
fn nan_in_the_data() {
    let mut c = Case::example("rnn").unwrap();
    c.data.pathologies = vec![Pathology::Nan {
        fraction: 0.01,
        from_step: 0,
    }];
    let d = diagnosis(c);
    assert_first(&d, CauseKind::Data);
    assert!(d.batch_raw.as_ref().unwrap().nan > 0);
    // Step 5 compared thread counts on the CPU (bit-identical); the thread
    // cause reports what its one-thread arm did.
    let hw = d.hardware.as_ref().expect("step 5 ran");
    assert_eq!(hw.arms[0].threads, Some(1));
    assert!(hw.agrees(), "{:?}", hw.disagreements);
    let threads = d
        .causes
        .iter()
        .find(|c| c.kind == CauseKind::Threads)
        .unwrap();
    assert_eq!(
        threads.fixes[0].result,
        format!("unstable: {}", d.finding.as_ref().unwrap().signature.slug())
    );
}

#[test]
fn augmentation_that_divides_by_zero() {
    let mut c = Case::example("cnn").unwrap();
    c.augment = vec![
        Augment::RandomErasing {
            p: 1.0,
            scale: [1.0, 1.0],
            ratio: [1.0, 1.0],
            value: 0.0,
        },
        Augment::Normalize(NormalizeSpec::PerSample { eps: 0.0 }),
    ];
    let d = diagnosis(c);
    assert_first(&d, CauseKind::Augmentation);
    let aug = d.batch_augmented.as_ref().unwrap();
    assert!(aug.nan > 0 && d.batch_raw.as_ref().unwrap().nan == 0);
}

#[test]
fn learning_rate_too_high() {
    let mut c = Case::example("cnn").unwrap();
    c.optimizer = sgd(50.0);
    let d = diagnosis(c);
    assert_first(&d, CauseKind::LearningRate);
}

#[test]
fn unsafe_loss() {
    let mut c = raw_cnn();
    c.data.scale = 1e3;
    c.optimizer = sgd(1e-9);
    c.loss = LossSpec::NaiveCrossEntropy { eps: 0.0 };
    let d = diagnosis(c);
    assert_first(&d, CauseKind::UnsafeLoss);
}

#[test]
fn adam_eps_zero() {
    let mut c = Case::example("cnn").unwrap();
    c.data.offset = -100.0;
    c.optimizer = OptimizerSpec::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 0.0,
        weight_decay: 0.0,
    };
    let d = diagnosis(c);
    assert_first(&d, CauseKind::OptimizerEps);
}

#[test]
fn half_precision_overflow() {
    let mut c = raw_cnn();
    c.data.scale = 8e3;
    c.optimizer = sgd(1e-9);
    c.precision = Precision::F16;
    let d = diagnosis(c);
    assert_first(&d, CauseKind::Precision);
}

#[test]
fn the_cli_prints_the_steps_and_the_ranked_causes() {
    let dir = scratch("diagnose-cli");
    let mut c = Case::example("rnn").unwrap();
    c.steps = 10;
    c.data.pathologies = vec![Pathology::Inf {
        fraction: 0.01,
        from_step: 0,
    }];
    let path = dir.join("case.json");
    std::fs::write(&path, c.to_json()).unwrap();
    let dump = dir.join("scene");
    let out = nanhunt(&[
        "diagnose",
        path.to_str().unwrap(),
        "--dump",
        dump.to_str().unwrap(),
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}{}", stderr(&out));
    for needle in [
        "step 1, reproduce",
        "step 2, data",
        "step 3, gradients",
        " 1. bad values in the data",
        "FIX clean data",
    ] {
        assert!(text.contains(needle), "`{needle}` missing:\n{text}");
    }
    assert!(dump.join("state.safetensors").is_file());
    let out = nanhunt(&["diagnose", cases("valid/rnn.json").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("nothing to diagnose"));
}

/// A case the runner rejects (here: a user's model with nothing to train)
/// is an error for diagnose and minimize (as for the LR tables), never "trained
/// stably" or "does not fail".
#[test]
fn a_rejected_case_stays_rejected_in_diagnose_and_minimize() {
    use nanhunt::models::{Model, ModuleModel};
    let mut case = Case::example("cnn").unwrap();
    case.model = ModelSpec::Custom(CustomSpec {
        name: "nothing_to_train".into(),
        input: InputSpec::Vector { features: 4 },
        outputs: 4,
        init: InitSpec::default(),
        per_token: false,
        frozen: Vec::new(),
    });
    let factory = |_: candle_nn::VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(ModuleModel(candle_nn::seq())))
    };
    let rejected = |e: nanhunt::Error| {
        assert!(matches!(e, nanhunt::Error::Rejected(_)), "{e:?}");
        assert!(e.to_string().contains("no trainable parameters"), "{e}");
    };
    rejected(diagnose(&case, &factory, &RunOptions::default()).unwrap_err());
    let opts = nanhunt::minimize::MinimizeOptions::default();
    rejected(nanhunt::minimize::minimize(&case, Some(&factory), &opts).unwrap_err());
}
