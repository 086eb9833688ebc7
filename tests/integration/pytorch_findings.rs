//! The framework mark of every reproducer in `corpora/repro` against what
//! PyTorch did with the same step: `scripts/pytorch-findings.py` re-ran
//! each reproducer's failing step in PyTorch from its dumped scene and
//! recorded the outcome in `docs/pytorch-findings.csv` (with the findings
//! of a 300-run campaign). A mark that changes, or that says what PyTorch
//! did not do, fails here.

use crate::support::*;
use nanhunt::campaign::{drawn_case, CampaignOptions};
use nanhunt::fidelity::FrameworkVerdict;
use nanhunt::repro::Reproducer;
use nanhunt::spec::Case;
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

/// The verdict as the table spells it (its serde name).
fn verdict_name(v: FrameworkVerdict) -> String {
    serde_json::to_value(v)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

/// Asserts that `case`'s finding carries the mark the table recorded for
/// `name`, and that the mark says what PyTorch did there.
fn assert_mark_as_recorded(name: &str, case: &Case, row: &HashMap<String, String>) {
    let Outcome::Unstable { finding } = run(case).unwrap() else {
        panic!("{name} no longer fails");
    };
    let mark = finding
        .precision
        .as_ref()
        .and_then(|c| c.framework.as_ref())
        .unwrap_or_else(|| panic!("{name}: no framework mark"));
    assert_eq!(
        verdict_name(mark.verdict),
        row["mark"],
        "{name}: the mark changed since the table was made ({}); re-make it with scripts/pytorch-findings.py",
        mark.summary()
    );
    let pytorch = row["pytorch"].as_str();
    match mark.verdict {
        FrameworkVerdict::FailsToo => assert_eq!(pytorch, "fails", "{name}: {}", mark.summary()),
        FrameworkVerdict::CandleSpecific => {
            assert_eq!(pytorch, "healthy", "{name}: {}", mark.summary())
        }
        _ => {}
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
        assert_mark_as_recorded(&stem, &repro.case, row);
    }
}

/// The campaign's findings in the table, each drawn again as the campaign
/// drew it (`campaign_cases`: run `index` of seed 0, no mutations) and run:
/// its mark must still be the one PyTorch's run was compared with.
#[test]
fn every_campaign_findings_mark_is_what_the_table_recorded_and_agrees_with_pytorch() {
    let table = table();
    let opts = CampaignOptions::default();
    let mut checked = 0;
    for (name, row) in &table {
        let Some(index) = name.strip_prefix("campaign/run-") else {
            continue;
        };
        let case = drawn_case(&opts, index.parse().unwrap());
        // The draw is the table's case: its knobs are the row's.
        assert_eq!(
            (case.model.family(), case.loss.name(), case.optimizer.name()),
            (
                row["family"].as_str(),
                row["loss"].as_str(),
                row["optimizer"].as_str()
            ),
            "{name}"
        );
        assert_mark_as_recorded(name, &case, row);
        checked += 1;
    }
    assert!(checked >= 100, "{checked} campaign findings in the table");
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
