//! `nanhunt lr-table`: the built-in families' table is snapshotted in
//! `snapshots/`; formats, a user's case file and bad options.

use crate::support::*;

fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(root().join("snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s
}

#[test]
fn the_default_table_of_the_builtin_families_matches_its_snapshot() {
    // The command's defaults: every family at its default size, sgd, adam
    // and adamw, f32, 3 seeds of 50 steps, 0.05 decades.
    let o = nanhunt(&["lr-table", "--quiet", "--jobs", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let md = stdout(&o);
    assert_eq!(md.matches("| f32 |").count(), 15, "{md}");
    settings().bind(|| insta::assert_snapshot!("lr_table_default_md", md));
}

#[test]
fn formats_agree_and_a_case_file_can_be_measured() {
    let dir = scratch("lr-table");
    let json = dir.join("table.json");
    let common = [
        "lr-table",
        "--quiet",
        "--family",
        "transformer",
        "--size",
        "small",
        "--optimizer",
        "sgd,momentum",
        "--seeds",
        "2",
        "--steps",
        "10",
        "--tolerance",
        "0.1",
    ];
    let mut args = common.to_vec();
    args.extend(["--format", "json", "--out", json.to_str().unwrap()]);
    let o = nanhunt(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let table: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = table["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["optimizer"], "momentum");
    assert_eq!(rows[0]["seeds"].as_array().unwrap().len(), 2);
    assert!(table["runs"].as_u64().unwrap() < table["grid_runs"].as_u64().unwrap());

    let mut args = common.to_vec();
    args.extend(["--format", "csv"]);
    let csv = stdout(&nanhunt(&args));
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "{csv}");
    assert!(lines[0].starts_with("family,size,optimizer,precision,divergence_median"));
    assert!(lines[2].starts_with("transformer,small,momentum,f32,"));

    // A case file (here a checked-in one) instead of a built-in family.
    let case = cases("valid/rnn.json");
    let o = nanhunt(&[
        "lr-table",
        "--quiet",
        "--case",
        case.to_str().unwrap(),
        "--optimizer",
        "adam",
        "--seeds",
        "1",
        "--steps",
        "5",
        "--tolerance",
        "0.5",
        "--no-curvature",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("| rnn | case | adam | f32 |"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn bad_options_exit_2_with_the_option_named() {
    for (args, needle) in [
        (vec!["--tolerance", "0"], "tolerance"),
        (vec!["--min-lr", "1", "--max-lr", "0.1"], "max_lr"),
        (vec!["--seeds", "0"], "seeds"),
        (vec!["--optimizer", "lion"], "lion"),
        (vec!["--precision", "f8"], "f8"),
        (
            vec!["--case", "/nonexistent/case.json"],
            "/nonexistent/case.json",
        ),
        (vec!["--device", "cuda:0"], "CUDA"),
    ] {
        let mut all = vec!["lr-table", "--quiet"];
        all.extend(&args);
        let o = nanhunt(&all);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
}
