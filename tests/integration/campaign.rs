//! Campaigns end to end: resume after SIGKILL loses and duplicates nothing,
//! shards merge, the minimizer's contract holds, and the checked-in
//! reproducers in `corpora/repro/` still reproduce.

use crate::support::*;
use nanhunt::finding::Verdict;
use nanhunt::journal::{Entry, JOURNAL_FILE};
use nanhunt::minimize::{minimize, CaseSize, MinimizeOptions};
use nanhunt::strategy::{generate, ModelScale, StrategyOptions};
use nanhunt::Outcome;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RUNS: u64 = 24;

fn fuzz(out: &Path, extra: &[&str]) -> std::process::Output {
    let runs = RUNS.to_string();
    let mut args = vec![
        "fuzz",
        "--runs",
        &runs,
        "--seed",
        "5",
        "--quiet",
        "--minimize-runs",
        "40",
        "--out",
    ];
    args.push(out.to_str().unwrap());
    args.extend_from_slice(extra);
    nanhunt(&args)
}

fn run_indices(entries: &[Entry]) -> Vec<u64> {
    entries
        .iter()
        .filter_map(|e| match e {
            Entry::Run { index, .. } => Some(*index),
            _ => None,
        })
        .collect()
}

#[test]
fn a_campaign_killed_with_sigkill_resumes_without_loss_or_duplicates() {
    // The reference: the same campaign, uninterrupted (one job: deterministic).
    let reference = scratch("campaign-reference");
    let out = fuzz(&reference, &[]);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    let want = journal(&reference);

    let dir = scratch("campaign-killed");
    let mut child = Command::new(binary())
        .args([
            "fuzz",
            "--runs",
            &RUNS.to_string(),
            "--seed",
            "5",
            "--quiet",
            "--minimize-runs",
            "40",
            "--out",
        ])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it mid-campaign, once some runs are journaled.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let runs = std::fs::read_to_string(dir.join(JOURNAL_FILE))
            .map(|t| t.matches("\"event\":\"run\"").count())
            .unwrap_or(0);
        if runs >= 6 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = journal(&dir);
    assert!(
        run_indices(&before).len() < RUNS as usize,
        "the kill came too late to test anything"
    );
    // A write cut short by the kill: a torn last line.
    let mut text = std::fs::read(dir.join(JOURNAL_FILE)).unwrap();
    text.extend_from_slice(b"{\"event\":\"run\",\"index\":9");
    std::fs::write(dir.join(JOURNAL_FILE), text).unwrap();

    let out = fuzz(&dir, &["--resume"]);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    let after = journal(&dir);

    // Every run exactly once.
    let mut indices = run_indices(&after);
    indices.sort_unstable();
    assert_eq!(indices, (0..RUNS).collect::<Vec<_>>());
    // Nothing found before the kill was lost, and the resumed campaign found
    // exactly what the uninterrupted one did.
    assert!(signatures(&before).is_subset(&signatures(&after)));
    assert_eq!(signatures(&after), signatures(&want));
    // One reproducer per signature, the same files as the reference.
    let files = reproducer_files(&dir);
    assert_eq!(files, reproducer_files(&reference));
    let per_signature: BTreeMap<String, usize> = after
        .iter()
        .filter_map(|e| match e {
            Entry::Reproducer { signature, .. } => Some(signature.slug()),
            _ => None,
        })
        .fold(BTreeMap::new(), |mut m, s| {
            *m.entry(s).or_insert(0) += 1;
            m
        });
    assert!(per_signature.values().all(|&n| n == 1), "{per_signature:?}");
    assert!(
        !files.iter().any(|f| f.starts_with('.')),
        "no temp files left: {files:?}"
    );
}

#[test]
fn process_and_thread_workers_journal_the_same_runs_and_reproducers() {
    let (p, t) = (scratch("workers-processes"), scratch("workers-threads"));
    assert!(fuzz(&p, &["--workers", "processes"])
        .status
        .code()
        .is_some());
    assert!(fuzz(&t, &["--workers", "threads"]).status.code().is_some());
    let (jp, jt) = (journal(&p), journal(&t));
    assert_eq!(runs_by_index(&jp).len(), RUNS as usize);
    // compared as JSON, where NaN losses are equal
    let json = |j: &[Entry]| -> Vec<String> {
        runs_by_index(j)
            .values()
            .map(|e| serde_json::to_string(e).unwrap())
            .collect()
    };
    assert_eq!(json(&jp), json(&jt));
    assert_eq!(reproducer_files(&p), reproducer_files(&t));
}

#[test]
fn a_worker_process_that_aborts_is_journaled_as_a_crash_and_replaced() {
    let dir = scratch("workers-abort");
    let out = Command::new(binary())
        .args([
            "fuzz",
            "--runs",
            "8",
            "--seed",
            "5",
            "--quiet",
            "--minimize-runs",
            "10",
        ])
        .args(["--workers", "processes", "--out", dir.to_str().unwrap()])
        .env(nanhunt::campaign::workers::ABORT_INDEX_ENV, "3")
        .output()
        .unwrap();
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    let runs = runs_by_index(&journal(&dir));
    assert_eq!(runs.len(), 8, "every run is journaled, the crashed one too");
    for (index, entry) in runs {
        let Entry::Run {
            verdict, message, ..
        } = entry
        else {
            unreachable!()
        };
        if index == 3 {
            assert_eq!(verdict, "crash");
            assert!(message.unwrap().contains("SIGABRT"));
        } else {
            assert_ne!(verdict, "crash", "run {index}: a fresh worker took over");
        }
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["errors"], 1);
}

#[test]
fn an_existing_campaign_needs_resume_and_matching_options() {
    let dir = scratch("campaign-options");
    let out = nanhunt(&[
        "fuzz",
        "--runs",
        "2",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(matches!(out.status.code(), Some(0 | 1)));
    let out = nanhunt(&[
        "fuzz",
        "--runs",
        "2",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--resume"), "{}", stderr(&out));
    let out = nanhunt(&[
        "fuzz",
        "--runs",
        "2",
        "--seed",
        "9",
        "--resume",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("another campaign: seed"),
        "{}",
        stderr(&out)
    );
    for bad in [["--shard", "2/2"], ["--budget", "5x"]] {
        let out = nanhunt(&["fuzz", bad[0], bad[1], "--out", dir.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}

#[test]
fn a_large_campaign_journals_its_size_and_resumes_only_at_it() {
    let dir = scratch("campaign-large");
    let args = |size: &'static str, resume: bool| {
        let mut a = vec!["fuzz", "--size", size, "--family", "transformer,rnn"];
        a.extend_from_slice(&["--runs", "3", "--seed", "4", "--quiet"]);
        a.extend_from_slice(&["--minimize-runs", "1", "--out", dir.to_str().unwrap()]);
        if resume {
            a.push("--resume");
        }
        a
    };
    let out = nanhunt(&args("large", false));
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    let entries = journal(&dir);
    assert!(
        matches!(&entries[0], Entry::Start { size, .. } if *size == ModelScale::Large),
        "{:?}",
        entries[0]
    );
    // Every run trained at its scale: none was rejected or ended in an error.
    let runs = runs_by_index(&entries);
    assert_eq!(runs.len(), 3);
    for run in runs.values() {
        let Entry::Run {
            verdict, message, ..
        } = run
        else {
            unreachable!()
        };
        assert!(
            matches!(verdict, Verdict::Stable | Verdict::Unstable),
            "{verdict:?} {message:?}"
        );
    }
    // The reports say what was drawn.
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("budget 3 runs, large models;"), "{md}");
    let out = nanhunt(&args("small", true));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("another campaign: size large (not small)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn shards_partition_the_runs_and_merge_into_one_campaign() {
    let (a, b, merged) = (
        scratch("shard-a"),
        scratch("shard-b"),
        scratch("shard-merged"),
    );
    for (dir, shard) in [(&a, "0/2"), (&b, "1/2")] {
        let out = nanhunt(&[
            "fuzz",
            "--runs",
            "6",
            "--shard",
            shard,
            "--seed",
            "2",
            "--quiet",
            "--minimize-runs",
            "20",
            "--out",
            dir.to_str().unwrap(),
        ]);
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    }
    let (ia, ib) = (run_indices(&journal(&a)), run_indices(&journal(&b)));
    assert!(ia.iter().all(|i| i % 2 == 0) && ib.iter().all(|i| i % 2 == 1));
    std::fs::remove_dir_all(&merged).unwrap();
    let out = nanhunt(&[
        "merge",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ]);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    let m = journal(&merged);
    let mut all = run_indices(&m);
    all.sort_unstable();
    assert_eq!(all, (0..12).collect::<Vec<_>>());
    let sigs = signatures(&journal(&a))
        .union(&signatures(&journal(&b)))
        .cloned()
        .collect::<BTreeSet<_>>();
    assert_eq!(signatures(&m), sigs);
    assert!(merged.join("summary.json").is_file());
}

/// Without mutation every case is a function of (seed, index): two shards
/// merge into exactly the runs of the same campaign in one process. (With
/// mutation each shard mutates its own findings; the test shows that too,
/// so that the equality is the option's doing.)
#[test]
fn without_mutation_merged_shards_equal_the_campaign_in_one_process() {
    let json = |j: &[Entry]| -> Vec<String> {
        runs_by_index(j)
            .values()
            .map(|e| serde_json::to_string(e).unwrap())
            .collect()
    };
    let campaign = |name: &str, runs: &str, extra: &[&str]| {
        let dir = scratch(name);
        let mut args = vec!["fuzz", "--runs", runs, "--seed", "7", "--quiet"];
        args.extend_from_slice(&["--minimize-runs", "1", "--out", dir.to_str().unwrap()]);
        args.extend_from_slice(extra);
        let out = nanhunt(&args);
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
        dir
    };
    let mut differing = Vec::new();
    for rate in ["0", "1"] {
        let one = campaign(
            &format!("one-process-{rate}"),
            "16",
            &["--mutation-rate", rate],
        );
        let shards: Vec<_> = ["0/2", "1/2"]
            .iter()
            .enumerate()
            .map(|(i, shard)| {
                let name = format!("no-mutation-{rate}-shard-{i}");
                campaign(&name, "8", &["--mutation-rate", rate, "--shard", shard])
            })
            .collect();
        let merged = scratch(&format!("no-mutation-{rate}-merged"));
        std::fs::remove_dir_all(&merged).unwrap();
        let mut args = vec!["merge".to_string()];
        args.extend(shards.iter().map(|d| d.to_str().unwrap().to_string()));
        args.extend(["--out".to_string(), merged.to_str().unwrap().to_string()]);
        let out = nanhunt(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
        let (a, b) = (json(&journal(&one)), json(&journal(&merged)));
        assert_eq!(a.len(), 16);
        assert_eq!(b.len(), 16);
        differing.push(a.iter().zip(&b).filter(|(x, y)| x != y).count());
        if rate == "0" {
            assert_eq!(a, b);
            assert_eq!(signatures(&journal(&one)), signatures(&journal(&merged)));
        }
    }
    assert!(
        differing[1] > 0,
        "mutating shards ran the one process's cases"
    );
    // A resumed campaign keeps its rate; a bad rate names the option.
    let dir = campaign("mutation-rate-resume", "2", &["--mutation-rate", "0"]);
    let out = nanhunt(&[
        "fuzz",
        "--runs",
        "2",
        "--seed",
        "7",
        "--resume",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("mutation rate"), "{}", stderr(&out));
    let out = nanhunt(&[
        "fuzz",
        "--mutation-rate",
        "1.5",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--mutation-rate"), "{}", stderr(&out));
}

/// The minimizer's contract on real failures drawn from the campaign's own
/// strategy: the result fails with the same signature, is a fixpoint (a
/// second minimization changes nothing), and is never larger.
#[test]
fn minimized_cases_keep_their_signature_are_fixpoints_and_never_grow() {
    let mut opts = StrategyOptions::default();
    opts.clean_data = true;
    opts.max_steps = 12;
    let budget = MinimizeOptions::default().with_max_runs(400);
    let mut checked = 0;
    for seed in 0..200u64 {
        let case = generate(&opts, seed);
        let Outcome::Unstable { finding } = nanhunt::run(&case).unwrap() else {
            continue;
        };
        let m = minimize(&case, None, &budget).unwrap().expect("it failed");
        assert!(m.fixpoint, "seed {seed}: budget too small for a fixpoint");
        assert_eq!(m.signature, finding.signature);
        assert!(
            m.after.within(&m.before),
            "seed {seed}: {:?} -> {:?}",
            m.before,
            m.after
        );
        assert_eq!(CaseSize::of(&m.case), m.after);
        let again = nanhunt::run(&m.case).unwrap();
        assert_eq!(again.finding().map(|f| &f.signature), Some(&m.signature));
        let m2 = minimize(&m.case, None, &budget)
            .unwrap()
            .expect("still fails");
        assert_eq!(
            m2.case, m.case,
            "seed {seed}: minimizing again changed the case"
        );
        checked += 1;
        if checked == 3 {
            break;
        }
    }
    assert_eq!(checked, 3, "the strategy yielded too few failing cases");
}

#[test]
fn the_checked_in_reproducers_still_reproduce() {
    let dir = root().join("corpora/repro");
    let files = nanhunt::regression::reproducer_files(&dir).unwrap();
    assert!(
        !files.is_empty(),
        "corpora/repro holds the campaign's reproducers"
    );
    nanhunt::regression::assert_dir_reproduces(&dir, None);
}

/// The accelerator probe (one device→host copy per step, updates checked
/// at the next step's copy), forced on the CPU, finds what the in-place CPU
/// probe finds: the same signature at the same step, for every reproducer,
/// with one synchronization per step.
#[test]
fn the_one_copy_per_step_probe_finds_what_the_cpu_probe_finds() {
    use nanhunt::models::BuiltinFactory;
    use nanhunt::runner::Session;
    let dir = root().join("corpora/repro");
    let accel = nanhunt::RunOptions::default().with_accelerator_probe(true);
    for file in nanhunt::regression::reproducer_files(&dir).unwrap() {
        let repro = nanhunt::repro::Reproducer::load(&file).unwrap();
        let builtin = BuiltinFactory::new(&repro.case.model).unwrap();
        let f = nanhunt::run_model(&repro.case, &builtin, &accel).unwrap();
        let f = f
            .finding()
            .unwrap_or_else(|| panic!("{}: stable", file.display()));
        assert_eq!(
            (&f.signature, f.step),
            (&repro.expected.signature, repro.expected.step),
            "{}",
            file.display()
        );
    }
    // A stable run: one synchronization per step and one at the end, and
    // the same loss history, bit for bit.
    let case = nanhunt::Case::example("transformer").unwrap();
    let factory = BuiltinFactory::new(&case.model).unwrap();
    let mut session = Session::new(&case, &factory, &accel).unwrap();
    for step in 0..case.steps {
        assert!(session.step(step).unwrap().is_none());
    }
    assert!(session.finish().unwrap().is_none());
    assert_eq!(session.host_syncs(), case.steps as u64 + 1);
    let cpu = nanhunt::run(&case).unwrap();
    assert_eq!(session.trace().losses, cpu.trace().unwrap().losses);
}
