//! Datasets from files through every command: the shipped digits with a
//! few planted bad samples (found by `scan-data`, `run`, `diagnose` and the
//! minimizer, and nothing else), files written by Python's safetensors and
//! NumPy, broken files, dumps and reproducers that carry their data.

use crate::support::*;
use nanhunt::data::{Dataset, Rows, SampleShape};
use nanhunt::models::{Model, Tracer};
use nanhunt::spec::*;
use nanhunt::{Outcome, RunOptions};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn digits() -> PathBuf {
    root().join("corpora/datasets/digits/digits.safetensors")
}

/// The digits' pixels as f32 (1797 × 64) and labels.
fn read_digits() -> (Vec<f32>, Vec<i64>) {
    let bytes = std::fs::read(digits()).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let x = st.tensor("inputs").unwrap();
    assert_eq!(x.dtype(), Dtype::U8);
    let values = x.data().iter().map(|&v| f32::from(v)).collect();
    let labels = st
        .tensor("labels")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (values, labels)
}

fn le_bytes_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn le_bytes_i64(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn write_digits(path: &Path, values: &[f32], labels: &[i64], labels_dtype: Dtype) {
    let x = le_bytes_f32(values);
    let y = match labels_dtype {
        Dtype::F32 => le_bytes_f32(&labels.iter().map(|&l| l as f32).collect::<Vec<_>>()),
        _ => le_bytes_i64(labels),
    };
    let n = labels.len();
    let tensors = vec![
        (
            "inputs",
            TensorView::new(Dtype::F32, vec![values.len() / 64, 1, 8, 8], &x).unwrap(),
        ),
        (
            "labels",
            TensorView::new(labels_dtype, vec![n], &y).unwrap(),
        ),
    ];
    safetensors::serialize_to_file(tensors, None, path).unwrap();
}

/// The planted samples: NaN, +Inf, 1e9, a label of 12, all zeros, NaN.
const PLANTED: [usize; 6] = [37, 411, 902, 1234, 1500, 1777];

/// A copy of the digits with the planted samples, beside a case on it.
fn planted(dir: &Path) -> PathBuf {
    let (mut x, mut y) = read_digits();
    x[37 * 64 + 20] = f32::NAN;
    x[411 * 64 + 5] = f32::INFINITY;
    x[902 * 64 + 33] = 1e9;
    y[1234] = 12;
    x[1500 * 64..1501 * 64].fill(0.0);
    x[1777 * 64 + 63] = f32::NAN;
    write_digits(&dir.join("digits_bad.safetensors"), &x, &y, Dtype::I64);
    case_on(dir, "digits_bad.safetensors", "case.json")
}

/// The shipped digits case, on another file beside it.
fn case_on(dir: &Path, file: &str, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(root().join("corpora/datasets/digits/digits_cnn.json"))
        .unwrap()
        .replace("\"digits.safetensors\"", &format!("\"{file}\""));
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

fn indices(v: &serde_json::Value) -> BTreeSet<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as usize)
        .collect()
}

#[test]
fn the_shipped_digits_train_and_scan_clean() {
    let case = root().join("corpora/datasets/digits/digits_cnn.json");
    let out = nanhunt(&["run", case.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let losses = json(&out)["trace"]["losses"].clone();
    let losses: Vec<f64> = serde_json::from_value(losses).unwrap();
    assert!(
        losses.last().unwrap() < &(0.6 * losses[0]),
        "training on the digits lowers the loss: {losses:?}"
    );
    let scan = nanhunt(&["scan-data", digits().to_str().unwrap(), "--report", "json"]);
    assert_eq!(scan.status.code(), Some(0), "{}", stdout(&scan));
    let scan = json(&scan);
    assert_eq!(scan["samples"], 1797);
    // Three pixels are 0 in every digit: a warning, not an error.
    let problems = scan["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0]["kind"], "constant_feature");
    assert_eq!(
        indices(&problems[0]["indices"]),
        BTreeSet::from([0, 32, 39])
    );
    assert_eq!(
        scan["labels"]["classes"], 10,
        "classes from the file's metadata"
    );
}

#[test]
fn scan_data_finds_exactly_the_planted_samples() {
    let dir = scratch("scan-planted");
    planted(&dir);
    let file = dir.join("digits_bad.safetensors");
    let out = nanhunt(&[
        "scan-data",
        file.to_str().unwrap(),
        "--classes",
        "10",
        "--report",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let scan = json(&out);
    let mut found = BTreeSet::new();
    for p in scan["problems"].as_array().unwrap() {
        if p["severity"] == "error" {
            found.extend(indices(&p["indices"]));
        }
    }
    assert_eq!(found, BTreeSet::from(PLANTED));
    let kinds: Vec<&str> = scan["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap())
        .collect();
    for kind in [
        "nan",
        "inf",
        "extreme",
        "label_out_of_range",
        "all_zero_sample",
    ] {
        assert!(kinds.contains(&kind), "{kinds:?}");
    }
    let md = nanhunt(&["scan-data", file.to_str().unwrap(), "--classes", "10"]);
    assert!(stdout(&md).contains("Fix: impute"), "{}", stdout(&md));
}

/// Six copies of the planted digits (10 782 samples, eleven blocks): several
/// chunks on every thread count, read, scanned and absorbed side by side.
#[test]
fn scan_data_gives_the_same_bytes_on_any_number_of_threads() {
    let dir = scratch("scan-threads");
    planted(&dir);
    let (x, y) = {
        let bytes = std::fs::read(dir.join("digits_bad.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let values = |name: &str| st.tensor(name).unwrap().data().to_vec();
        (values("inputs"), values("labels"))
    };
    let x: Vec<f32> = x
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let y: Vec<i64> = y
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let file = dir.join("six.safetensors");
    write_digits(&file, &x.repeat(6), &y.repeat(6), Dtype::I64);
    let report = |threads: &str| {
        let out = nanhunt(&[
            "scan-data",
            file.to_str().unwrap(),
            "--classes",
            "10",
            "--threads",
            threads,
            "--report",
            "json",
        ]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        stdout(&out)
    };
    let one = report("1");
    let scan: serde_json::Value = serde_json::from_str(&one).unwrap();
    assert_eq!(scan["samples"], 6 * 1797);
    let nan = scan["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["kind"] == "nan")
        .unwrap();
    assert_eq!(nan["count"], 12, "{nan}");
    for threads in ["2", "3"] {
        assert_eq!(report(threads), one, "--threads {threads}");
    }
}

/// The sample a finding's detail names ("sample 411 of ...").
fn named_sample(detail: &str) -> usize {
    let at = detail.find("sample ").unwrap_or_else(|| panic!("{detail}")) + 7;
    detail[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn run_diagnose_and_minimize_name_only_planted_samples() {
    let dir = scratch("planted-commands");
    let case = planted(&dir);
    let case = case.to_str().unwrap();

    let run = nanhunt(&["run", case, "--json"]);
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    let finding = &json(&run)["finding"];
    assert_eq!(finding["phase"], "data", "{finding}");
    assert!(PLANTED.contains(&named_sample(finding["detail"].as_str().unwrap())));

    let diag = nanhunt(&["diagnose", case, "--json"]);
    assert_eq!(diag.status.code(), Some(1), "{}", stderr(&diag));
    let diag = json(&diag);
    let data = diag["causes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "data")
        .unwrap();
    assert_eq!(diag["causes"][0]["kind"], "data", "ranked first");
    // A batch bad before the model ran spends no run on the model's settings.
    let kinds: Vec<&str> = diag["causes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["kind"].as_str())
        .collect();
    assert!(!kinds.contains(&"learning_rate"), "{kinds:?}");
    // The reproduction, the hardware arm and the data's fixes (14 runs when
    // the learning-rate search ran too).
    assert!(diag["runs"].as_u64().unwrap() <= 6, "{}", diag["runs"]);
    let fix = data["fixes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["description"].as_str().unwrap().contains("without the"))
        .unwrap();
    assert_eq!(fix["verified"], true, "{fix}");
    let excluded = fix["changes"][0]["after"]["exclude"].clone();
    assert_eq!(indices(&excluded), BTreeSet::from(PLANTED), "{fix}");

    let repro = dir.join("repro.json");
    let min = nanhunt(&["minimize", case, "--out", repro.to_str().unwrap()]);
    assert_eq!(min.status.code(), Some(1), "{}", stderr(&min));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&repro).unwrap()).unwrap();
    let source = &r["case"]["data"]["source"];
    let kept = indices(&source["sampling"]["indices"]);
    assert!(
        !kept.is_empty() && kept.is_subset(&BTreeSet::from(PLANTED)),
        "{source}"
    );
    assert_eq!(
        source["path"], "digits_bad.safetensors",
        "relative to the reproducer"
    );
    assert_eq!(source["sha256"].as_str().unwrap().len(), 64);
    let named = r["provenance"]["samples"].as_str().unwrap();
    assert!(named.ends_with("of digits_bad.safetensors"), "{named}");
    assert!(stderr(&min).contains(named), "{}", stderr(&min));

    // The reproducer replays; with its file changed or gone it says so.
    let replay = nanhunt(&["replay", repro.to_str().unwrap()]);
    assert_eq!(replay.status.code(), Some(0), "{}", stderr(&replay));
    let file = dir.join("digits_bad.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let mut changed = bytes.clone();
    let at = changed.len() - 100;
    changed[at] ^= 1;
    std::fs::write(&file, &changed).unwrap();
    let replay = nanhunt(&["replay", repro.to_str().unwrap()]);
    assert_eq!(replay.status.code(), Some(2));
    assert!(
        stderr(&replay).contains("changed since the case was written"),
        "{}",
        stderr(&replay)
    );
    std::fs::remove_file(&file).unwrap();
    let replay = nanhunt(&["replay", repro.to_str().unwrap()]);
    assert_eq!(replay.status.code(), Some(2));
    assert!(
        stderr(&replay).contains("digits_bad.safetensors") && stderr(&replay).contains("missing"),
        "{}",
        stderr(&replay)
    );
}

#[test]
fn a_dump_replays_its_saved_batch_without_the_data_file() {
    let dir = scratch("dump-batch");
    let case = planted(&dir);
    let dump = dir.join("dump");
    let run = nanhunt(&[
        "run",
        case.to_str().unwrap(),
        "--dump",
        dump.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    std::fs::rename(dir.join("digits_bad.safetensors"), dir.join("elsewhere")).unwrap();
    let replay = nanhunt(&["replay", dump.to_str().unwrap()]);
    assert_eq!(
        replay.status.code(),
        Some(0),
        "{}{}",
        stdout(&replay),
        stderr(&replay)
    );
    // A data fault stops the step before any loss: nothing to compare bit
    // for bit, and the replay does not claim it.
    assert!(
        stdout(&replay).contains("reproduced:") && !stdout(&replay).contains("bit-identical"),
        "{}",
        stdout(&replay)
    );
    let case_json = std::fs::read_to_string(dump.join("case.json")).unwrap();
    assert!(
        case_json.contains("\"../digits_bad.safetensors\""),
        "{case_json}"
    );
    assert!(
        case_json.contains("\"sha256\""),
        "the dump names the exact data"
    );
}

#[test]
fn the_same_case_on_the_same_file_gives_the_same_bits() {
    let case = root().join("corpora/datasets/digits/digits_cnn.json");
    let a = nanhunt(&["run", case.to_str().unwrap(), "--json"]);
    let b = nanhunt(&["run", case.to_str().unwrap(), "--json"]);
    assert_eq!(a.status.code(), Some(0));
    assert_eq!(stdout(&a), stdout(&b));
}

#[test]
fn files_written_by_python_load_in_every_format_with_the_same_results() {
    let dir = scratch("python-formats");
    let script = format!(
        r#"
import numpy as np
from safetensors.numpy import load_file, save_file
d = load_file({digits:?})
x = d["inputs"][:300].astype(np.float32)
y = d["labels"][:300]
save_file({{"inputs": x, "labels": y}}, "py.safetensors")
np.save("py.npy", x)
np.save("py_labels.npy", y.astype(np.int32))
np.savez_compressed("py.npz", inputs=x.astype(np.float64), labels=y)
with open("py.csv", "w") as f:
    f.write(",".join([f"p{{i}}" for i in range(64)] + ["label"]) + "\n")
    for row, label in zip(x.reshape(300, 64), y):
        f.write(",".join(str(int(v)) for v in row) + f",{{label}}\n")
"#,
        digits = digits().to_str().unwrap()
    );
    let status = python_with_safetensors()
        .current_dir(&dir)
        .args(["-c", &script])
        .status()
        .unwrap();
    assert!(status.success());
    let sources = [
        r#"{"kind": "file", "path": "py.safetensors"}"#,
        r#"{"kind": "file", "path": "py.npy", "labels": "py_labels.npy"}"#,
        r#"{"kind": "file", "path": "py.npz"}"#,
        r#"{"kind": "file", "path": "py.csv", "labels": "label"}"#,
    ];
    let mut runs = Vec::new();
    for (i, source) in sources.iter().enumerate() {
        let text = std::fs::read_to_string(root().join("corpora/datasets/digits/digits_cnn.json"))
            .unwrap();
        let mut case: serde_json::Value = serde_json::from_str(&text).unwrap();
        case["data"]["source"] = serde_json::from_str(source).unwrap();
        case["steps"] = 12.into();
        let path = dir.join(format!("case{i}.json"));
        std::fs::write(&path, case.to_string()).unwrap();
        let out = nanhunt(&["run", path.to_str().unwrap(), "--json"]);
        assert_eq!(out.status.code(), Some(0), "{source}: {}", stderr(&out));
        runs.push(json(&out)["trace"]["losses"].clone());
    }
    for r in &runs[1..] {
        assert_eq!(r, &runs[0], "the same samples train the same bits");
    }
    let scans: Vec<serde_json::Value> = ["py.safetensors", "py.npz"]
        .iter()
        .map(|f| {
            json(&nanhunt(&[
                "scan-data",
                dir.join(f).to_str().unwrap(),
                "--report",
                "json",
            ]))
        })
        .collect();
    assert_eq!(scans[0]["feature_stats"], scans[1]["feature_stats"]);
}

#[test]
fn broken_and_mismatched_data_files_exit_2_naming_file_and_part() {
    let dir = scratch("broken-data");
    let (x, y) = read_digits();
    let check = |file: &str, expect: &[&str]| {
        let case = case_on(&dir, file, &format!("{file}.json"));
        let out = nanhunt(&["run", case.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{file}: {}", stdout(&out));
        for e in expect {
            assert!(
                stderr(&out).contains(e),
                "{file}: want {e:?} in {}",
                stderr(&out)
            );
        }
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    };
    write_digits(&dir.join("float_labels.safetensors"), &x, &y, Dtype::F32);
    check(
        "float_labels.safetensors",
        &["float_labels.safetensors", "`labels`", "integer"],
    );
    write_digits(&dir.join("short.safetensors"), &x, &y[..1000], Dtype::I64);
    check(
        "short.safetensors",
        &["short.safetensors", "`labels` holds 1000 samples"],
    );
    let whole = std::fs::read(digits()).unwrap();
    std::fs::write(dir.join("cut.safetensors"), &whole[..whole.len() / 2]).unwrap();
    check(
        "cut.safetensors",
        &["cannot parse dataset", "cut.safetensors"],
    );
    check("absent.safetensors", &["absent.safetensors", "missing"]);
    // 32 values per sample for a model that reads 64.
    write_digits_flat(&dir.join("narrow.safetensors"), &x[..1797 * 32], 32);
    check(
        "narrow.safetensors",
        &["narrow.safetensors", "do not fit the model's input"],
    );
}

fn write_digits_flat(path: &Path, values: &[f32], per: usize) {
    let n = values.len() / per;
    let x = le_bytes_f32(values);
    let y = le_bytes_i64(&vec![0; n]);
    let tensors = vec![
        (
            "inputs",
            TensorView::new(Dtype::F32, vec![n, per], &x).unwrap(),
        ),
        ("labels", TensorView::new(Dtype::I64, vec![n], &y).unwrap()),
    ];
    safetensors::serialize_to_file(tensors, None, path).unwrap();
}

/// A language-model-style dataset of the user's own: token sequences whose
/// label at each position is the next token.
struct NextToken;

impl Dataset for NextToken {
    fn name(&self) -> String {
        "next_token".into()
    }
    fn len(&self) -> usize {
        64
    }
    fn shape(&self) -> SampleShape {
        SampleShape {
            dims: vec![8],
            integer: true,
            labels: 8,
            targets: 0,
        }
    }
    fn append(&self, index: usize, rows: &mut Rows) -> nanhunt::Result<()> {
        let ids: Vec<i64> = (0..9).map(|t| ((index + t * 3) % 16) as i64).collect();
        rows.values.extend(ids[..8].iter().map(|&i| i as f32));
        rows.labels.extend_from_slice(&ids[1..]);
        Ok(())
    }
}

/// Embedding + linear head: (batch, positions) → (batch, positions, vocab).
struct TinyLm {
    embed: candle_nn::Embedding,
    head: candle_nn::Linear,
}

impl Model for TinyLm {
    fn forward(
        &self,
        input: &candle_core::Tensor,
        tracer: &mut Tracer,
    ) -> candle_core::Result<candle_core::Tensor> {
        use candle_core::Module;
        let h = tracer.record("embed", self.embed.forward(input)?)?;
        tracer.record("head", self.head.forward(&h.tanh()?)?)
    }
}

fn tiny_lm(vb: candle_nn::VarBuilder) -> candle_core::Result<Box<dyn Model>> {
    Ok(Box::new(TinyLm {
        embed: candle_nn::embedding(16, 8, vb.pp("embed"))?,
        head: candle_nn::linear(8, 16, vb.pp("head"))?,
    }))
}

fn lm_case(per_token: bool, loss: LossSpec) -> Case {
    let mut c = Case::example("transformer").unwrap();
    c.model = ModelSpec::Custom(
        CustomSpec::new(
            "tiny_lm",
            InputSpec::Tokens {
                seq_len: 8,
                vocab: 16,
            },
            16,
        )
        .per_token(per_token),
    );
    c.data = DataSpec {
        source: SourceSpec::User {
            name: "next_token".into(),
            sampling: Sampling::default(),
        },
        ..DataSpec::default()
    };
    c.loss = loss;
    c.steps = 30;
    c.batch_size = 8;
    c.optimizer = sgd(0.5);
    c
}

#[test]
fn a_user_dataset_trains_a_per_token_model_with_a_user_loss() {
    let opts = RunOptions::default()
        .with_dataset(Arc::new(NextToken))
        .with_loss(Arc::new(
            |logits: &candle_core::Tensor, targets: &candle_core::Tensor| {
                // Cross-entropy written by the user: -sum(t * log_softmax(z)) / rows.
                let logp = candle_nn::ops::log_softmax(logits, 1)?;
                (targets * logp)?.sum_all()?.neg()? / logits.dim(0)? as f64
            },
        ));
    let custom = LossSpec::Custom {
        name: "my_cross_entropy".into(),
        targets: TargetKind::Labels,
    };
    let out = nanhunt::run_model(&lm_case(true, custom.clone()), &tiny_lm, &opts).unwrap();
    let Outcome::Stable { trace } = out else {
        panic!("{out:?}")
    };
    assert!(
        trace.losses.last().unwrap() < &(0.5 * trace.losses[0]),
        "{:?}",
        trace.losses
    );

    // Without `per_token`, per-position labels do not fit the model ...
    let Outcome::Rejected { reason } =
        nanhunt::run_model(&lm_case(false, custom.clone()), &tiny_lm, &opts).unwrap()
    else {
        panic!("rejected")
    };
    assert!(reason.contains("per_token: true"), "{reason}");
    // ... and on synthetic data the model's output does not fit the
    // targets: a clear error naming the fix, not candle's shape error.
    let mut synthetic = lm_case(
        false,
        LossSpec::CrossEntropy {
            label_smoothing: 0.0,
        },
    );
    synthetic.data = DataSpec::default();
    let e = nanhunt::run_model(&synthetic, &tiny_lm, &RunOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("per_token: true") && e.contains("[8, 8, 16]"),
        "{e}"
    );
    // A custom loss without its closure, a user source without its dataset.
    let bare = RunOptions::default();
    let Outcome::Rejected { reason } =
        nanhunt::run_model(&lm_case(true, custom), &tiny_lm, &bare).unwrap()
    else {
        panic!("rejected")
    };
    assert!(
        reason.contains("needs its dataset") || reason.contains("needs its closure"),
        "{reason}"
    );
}

#[test]
fn a_campaign_over_a_dataset_fuzzes_the_knobs_and_keeps_the_data() {
    let out = scratch("fuzz-data");
    let dir = out.join("campaign");
    let data = digits();
    let args = |extra: &[&str]| {
        let mut a = vec![
            "fuzz",
            "--data",
            data.to_str().unwrap(),
            "--runs",
            "24",
            "--minimize-runs",
            "20",
            "--jobs",
            "2",
            "--quiet",
            "--out",
            dir.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run = |a: Vec<String>| {
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        nanhunt(&refs)
    };
    let first = run(args(&[]));
    assert!(
        matches!(first.status.code(), Some(0 | 1)),
        "{}",
        stderr(&first)
    );
    let entries = journal(&dir);
    let families: BTreeSet<&str> = entries
        .iter()
        .filter_map(|e| match e {
            nanhunt::journal::Entry::Run { family, .. } => Some(family.as_str()),
            _ => None,
        })
        .collect();
    assert!(families.len() >= 2, "{families:?}");
    let cases: Vec<&Case> = entries
        .iter()
        .filter_map(|e| match e {
            nanhunt::journal::Entry::Finding { case, .. } => Some(&**case),
            _ => None,
        })
        .collect();
    assert!(!cases.is_empty());
    for c in &cases {
        let SourceSpec::File(f) = &c.data.source else {
            panic!("every case trains on the file")
        };
        assert_eq!(f.path, digits());
        assert_eq!(f.sha256.as_deref().map(str::len), Some(64));
        assert_eq!(c.model.classes(), 10);
        assert_eq!(c.model.input().numel(), 64);
    }
    // Reproducers replay from where they were written.
    let files = reproducer_files(&dir);
    assert!(!files.is_empty(), "24 runs on the digits find something");
    for name in files {
        let file = dir.join("repro").join(&name);
        let replay = nanhunt(&["replay", file.to_str().unwrap()]);
        assert_eq!(replay.status.code(), Some(0), "{name}: {}", stderr(&replay));
    }
    // Resuming with another dataset is refused.
    let other_root = scratch("fuzz-data-other");
    let other = other_root.join("d.safetensors");
    let (mut x, y) = read_digits();
    x[0] = 1.0;
    write_digits(&other, &x, &y, Dtype::I64);
    let mut a = args(&["--resume"]);
    a[2] = other.to_str().unwrap().to_string();
    let refused = run(a);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("dataset"), "{}", stderr(&refused));
}

#[test]
fn gradcheck_diff_and_lr_tables_run_on_a_dataset() {
    let case = root().join("corpora/datasets/digits/digits_cnn.json");
    let case = case.to_str().unwrap();
    let g = nanhunt(&["gradcheck", case]);
    assert_eq!(g.status.code(), Some(0), "{}{}", stdout(&g), stderr(&g));
    assert!(stdout(&g).contains("all gradients match"), "{}", stdout(&g));
    let d = nanhunt(&["diff", case, "--threads", "1,2"]);
    assert_eq!(d.status.code(), Some(0), "{}{}", stdout(&d), stderr(&d));
    let t = nanhunt(&[
        "lr-table",
        "--case",
        case,
        "--optimizer",
        "sgd",
        "--seeds",
        "1",
        "--steps",
        "20",
        "--no-curvature",
        "--format",
        "json",
        "--quiet",
    ]);
    assert_eq!(t.status.code(), Some(0), "{}", stderr(&t));
    let table = json(&t);
    let text = table.to_string();
    assert!(
        text.contains("\"size\":\"case\"") || text.contains("case"),
        "{text}"
    );
}

/// The pin: a file swapped for an all-NaN one (by rename, in a loop) while
/// it loads is refused as changed, or loaded as the file whose SHA-256 the
/// load records — never a NaN file under the good file's hash.
#[test]
fn a_file_swapped_while_it_loads_is_refused_or_read_as_the_file_it_hashed() {
    use nanhunt::data::files::{load, sha256};
    let dir = crate::support::scratch("pin-swap");
    let rows = |v: &str| {
        let mut s = String::from("a,b,c,d,label\n");
        for i in 0..2000 {
            s.push_str(&format!("{v},{v},{v},{v},{}\n", i % 3));
        }
        s
    };
    let (good, bad) = (dir.join("good.csv"), dir.join("bad.csv"));
    std::fs::write(&good, rows("1.5")).unwrap();
    std::fs::write(&bad, rows("nan")).unwrap();
    let good_hash = sha256(std::slice::from_ref(&good)).unwrap();
    let bad_hash = sha256(std::slice::from_ref(&bad)).unwrap();
    let data = dir.join("data.csv");
    std::fs::copy(&good, &data).unwrap();
    let mut source = nanhunt::spec::FileSource::new(&data);
    source.labels = Some("label".into());
    source.sha256 = Some(good_hash.clone());
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let swaps = std::sync::Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps, dir, data) =
            (stop.clone(), swaps.clone(), dir.to_path_buf(), data.clone());
        let (good, bad) = (good.clone(), bad.clone());
        std::thread::spawn(move || {
            let tmp = dir.join("next.csv");
            while !stop.load(Ordering::Relaxed) {
                let n = swaps.load(Ordering::Relaxed);
                let from = if n % 2 == 0 { &bad } else { &good };
                std::fs::copy(from, &tmp).unwrap();
                std::fs::rename(&tmp, &data).unwrap();
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let (mut loaded, mut refused) = (0, 0);
    let started = std::time::Instant::now();
    let mut i = 0;
    // 300 loads and 100 swaps at least (within 30 s).
    while (i < 300 || swaps.load(Ordering::Relaxed) < 100)
        && started.elapsed() < std::time::Duration::from_secs(30)
    {
        i += 1;
        // The process's cache is keyed by the file's size and mtime,
        // which every swap changes: each load reads the file again.
        match load(&source, 64 << 20) {
            Ok(d) => {
                assert_eq!(d.sha256.as_deref(), Some(good_hash.as_str()));
                assert!(
                    d.values.iter().all(|v| v.is_finite()),
                    "load {i}: NaN under the good hash"
                );
                loaded += 1;
            }
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.contains("the file changed") && e.contains(&bad_hash)
                        || e.contains("No such file"),
                    "{e}"
                );
                refused += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let swaps = swaps.load(Ordering::Relaxed);
    assert!(swaps >= 100 && loaded + refused >= 300, "{swaps} swaps");
    println!("{loaded} loaded, {refused} refused over {swaps} swaps");
}
