//! The framework mark of every reproducer in `corpora/repro` against what
//! PyTorch did with the same step: `scripts/pytorch-findings.py` re-ran
//! each reproducer's failing step in PyTorch from its dumped scene and
//! recorded the outcome in `docs/pytorch-findings.csv` (with the findings
//! of a 300-run campaign). A mark that changes, or that says what PyTorch
//! did not do, fails here.

use crate::support::*;
use nanhunt::fidelity::FrameworkVerdict;
use nanhunt::repro::Reproducer;
use nanhunt::{run, Outcome};
use std::collections::HashMap;

/// The table's rows by finding (`repro/<stem>`, `campaign/run-NNNN`).
fn table() -> HashMap<String, HashMap<String, String>> {
    let path = root().join("docs/pytorch-findings.csv");
    let mut reader = csv::Reader::from_path(&path).unwrap();
    let headers = reader.headers().unwrap().clone();
    reader
        .records()
        .map(|r| {
            let row: HashMap<String, String> = headers
                .iter()
                .zip(r.unwrap().iter())
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect();
            (row["finding"].clone(), row)
        })
        .collect()
}

fn verdict_name(v: FrameworkVerdict) -> &'static str {
    match v {
        FrameworkVerdict::FailsToo => "fails_too",
        FrameworkVerdict::CandleSpecific => "candle_specific",
        _ => "not_judged",
    }
}

#[test]
fn every_reproducers_mark_is_what_the_table_recorded_and_agrees_with_pytorch() {
    let table = table();
    let mut paths: Vec<_> = std::fs::read_dir(root().join("corpora/repro"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 20, "corpora/repro has its reproducers");
    for path in paths {
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let row = table
            .get(&format!("repro/{stem}"))
            .unwrap_or_else(|| panic!("{stem} is not in docs/pytorch-findings.csv: re-make the table (scripts/pytorch-findings.py)"));
        let repro = Reproducer::load(&path).unwrap();
        let Outcome::Unstable { finding } = run(&repro.case).unwrap() else {
            panic!("{stem} no longer fails");
        };
        let mark = finding
            .precision
            .as_ref()
            .and_then(|c| c.framework.as_ref())
            .unwrap_or_else(|| panic!("{stem}: no framework mark"));
        assert_eq!(
            verdict_name(mark.verdict),
            row["mark"],
            "{stem}: the mark changed since the table was made ({}); re-make it with scripts/pytorch-findings.py",
            mark.summary()
        );
        let pytorch = row["pytorch"].as_str();
        match mark.verdict {
            FrameworkVerdict::FailsToo => {
                assert_eq!(pytorch, "fails", "{stem}: {}", mark.summary())
            }
            FrameworkVerdict::CandleSpecific => {
                assert_eq!(pytorch, "healthy", "{stem}: {}", mark.summary())
            }
            _ => {}
        }
    }
}

/// The checked-in table holds at least 100 findings over every family and
/// precision, and no judged mark in it disagrees with PyTorch.
#[test]
fn the_table_covers_the_families_and_precisions_and_every_judged_mark_agrees() {
    let table = table();
    assert!(table.len() >= 100, "{} findings", table.len());
    for (column, wanted) in [
        (
            "family",
            &["cnn", "transformer", "rnn", "decoder", "encoder"][..],
        ),
        ("precision", &["f32", "f64", "f16", "bf16", "mixed"][..]),
    ] {
        for w in wanted {
            assert!(
                table.values().any(|r| r[column] == *w),
                "no finding with {column} {w}"
            );
        }
    }
    for (name, row) in &table {
        assert_ne!(row["agrees"], "no", "{name}: {row:?}");
        if row["port_check"].starts_with("MISMATCH") {
            panic!("{name}: the PyTorch port computed another loss: {row:?}");
        }
    }
}
