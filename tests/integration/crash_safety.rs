//! Campaigns that cannot lose work: the window between a run and its
//! finding, workers that die between requests or while minimizing, runs past
//! their time limit, the exit code of a campaign resumed after a kill, and
//! no temp file left behind.

use crate::support::*;
use nanhunt::journal::{Entry, Unminimized, JOURNAL_FILE};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const RUNS: &str = "24";

fn fuzz_args(out: &Path) -> Vec<String> {
    [
        "fuzz",
        "--runs",
        RUNS,
        "--seed",
        "5",
        "--quiet",
        "--minimize-runs",
        "40",
        "--out",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([out.to_str().unwrap().to_string()])
    .collect()
}

fn fuzz_with(out: &Path, extra: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(binary());
    cmd.args(fuzz_args(out)).args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Run entries as JSON (where NaN losses are equal), by index, without timings.
fn runs(entries: &[Entry]) -> Vec<String> {
    runs_by_index(entries)
        .values()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect()
}

fn reproduced(entries: &[Entry]) -> BTreeSet<String> {
    entries
        .iter()
        .filter_map(|e| match e {
            Entry::Reproducer { signature, .. } => Some(signature.slug()),
            _ => None,
        })
        .collect()
}

fn no_temp_files(dir: &Path) {
    for sub in [dir.to_path_buf(), dir.join("repro")] {
        let temps: Vec<_> = std::fs::read_dir(&sub)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| f.contains(".tmp-"))
            .collect();
        assert!(temps.is_empty(), "{}: {temps:?}", sub.display());
    }
}

/// The reference campaign: uninterrupted, one job, so deterministic.
fn reference(name: &str) -> (crate::support::Scratch, Vec<Entry>) {
    let dir = scratch(name);
    let out = fuzz_with(&dir, &[], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let entries = journal(&dir);
    assert!(
        signatures(&entries).len() >= 2,
        "the reference must find something"
    );
    (dir, entries)
}

#[test]
fn a_journal_cut_between_a_run_and_its_finding_resumes_with_every_signature_minimized() {
    let (reference_dir, want) = reference("cut-reference");
    // Cut the journal right after the run entry of the second new signature,
    // as a kill between the two appends (or inside their one write) would.
    let text = std::fs::read_to_string(reference_dir.join(JOURNAL_FILE)).unwrap();
    let mut kept = String::new();
    let mut findings = 0;
    for line in text.lines() {
        if line.contains("\"event\":\"finding\"") {
            findings += 1;
            if findings == 2 {
                break;
            }
        }
        kept.push_str(line);
        kept.push('\n');
    }
    let dir = scratch("cut-resumed");
    std::fs::write(dir.join(JOURNAL_FILE), kept).unwrap();
    // The first signature's reproducer exists, as it did at the kill.
    std::fs::create_dir_all(dir.join("repro")).unwrap();
    for e in journal(&dir) {
        if let Entry::Reproducer { file, .. } = e {
            std::fs::copy(
                reference_dir.join("repro").join(&file),
                dir.join("repro").join(&file),
            )
            .unwrap();
        }
    }
    let out = fuzz_with(&dir, &["--resume"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let got = journal(&dir);
    // The cut run was redone from the same state: the same runs, in the same
    // order, the same signatures, every one minimized, the same files.
    assert_eq!(runs(&got), runs(&want));
    assert_eq!(signatures(&got), signatures(&want));
    assert_eq!(
        reproduced(&got),
        signatures(&got),
        "every signature minimized"
    );
    assert_eq!(reproducer_files(&dir), reproducer_files(&reference_dir));
    assert!(!stdout(&out).contains("not minimized"), "{}", stdout(&out));
    no_temp_files(&dir);
}

#[test]
fn a_campaign_resumed_after_a_kill_reports_what_the_killed_session_found() {
    let (reference_dir, want) = reference("reported-reference");
    // The session was killed after its last run, before it reported: drop
    // its `reported` entry.
    let dir = scratch("reported-resumed");
    let text = std::fs::read_to_string(reference_dir.join(JOURNAL_FILE)).unwrap();
    let unreported: String = text
        .lines()
        .filter(|l| !l.contains("\"event\":\"reported\""))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(unreported.len(), text.len(), "the session reported");
    std::fs::write(dir.join(JOURNAL_FILE), unreported).unwrap();
    // A session killed after it printed its summary, before it journaled
    // the signatures as reported: they are still the next session's news.
    let abort = [(nanhunt::campaign::ABORT_BEFORE_REPORTED_ENV, "1")];
    let out = fuzz_with(&dir, &["--resume"], &abort);
    assert_eq!(out.status.code(), None, "killed: {}", stderr(&out));
    let news = format!("({} new)", signatures(&want).len());
    assert!(stdout(&out).contains(&news), "{}", stdout(&out));
    let out = fuzz_with(&dir, &["--resume"], &[]);
    // No run left to do, but signatures no session reported: exit 1.
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["runs_this_session"], 0);
    assert_eq!(
        summary["new_signatures"].as_array().unwrap().len(),
        signatures(&want).len()
    );
    // Reported now: the next resume exits 0.
    let out = fuzz_with(&dir, &["--resume"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_worker_that_closed_its_pipe_is_replaced_and_the_campaign_finishes() {
    let (_, want) = reference("pipe-reference");
    let dir = scratch("pipe-closed");
    // The child closes its input and exits after answering run 3: the next
    // write meets a closed pipe (SIGPIPE killed the campaign before).
    let out = fuzz_with(
        &dir,
        &["--workers", "processes"],
        &[(nanhunt::campaign::workers::EXIT_AFTER_INDEX_ENV, "3")],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("between requests; starting a fresh one"),
        "{}",
        stderr(&out)
    );
    // Nothing ran in the dead child: the request went to a fresh one.
    assert_eq!(runs(&journal(&dir)), runs(&want));
    assert!(stdout(&out).contains("24 runs"), "{}", stdout(&out));
}

#[test]
fn a_worker_that_dies_while_minimizing_is_retried_then_reported() {
    let (_, want) = reference("minimize-reference");
    let first = want
        .iter()
        .find_map(|e| match e {
            Entry::Finding {
                index, signature, ..
            } => Some((*index, signature.slug())),
            _ => None,
        })
        .unwrap();
    let dir = scratch("minimize-dies");
    let out = fuzz_with(
        &dir,
        &[],
        &[(
            nanhunt::campaign::workers::ABORT_MINIMIZE_ENV,
            &first.0.to_string(),
        )],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let got = journal(&dir);
    let died: Vec<_> = got
        .iter()
        .filter_map(|e| match e {
            Entry::Unminimized {
                signature,
                reason,
                message,
            } => Some((signature.slug(), *reason, message.clone())),
            _ => None,
        })
        .collect();
    // Tried twice, journaled twice, then given up on; the others minimized.
    assert_eq!(died.len(), 2, "{died:?}");
    for (slug, reason, message) in &died {
        assert_eq!((slug, *reason), (&first.1, Unminimized::WorkerDied));
        assert!(message.contains("SIGABRT"), "{message}");
    }
    assert!(stderr(&out).contains("attempt 2 of 2"), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("(not minimized: the worker process died"),
        "{}",
        stdout(&out)
    );
    let mut others = signatures(&got);
    others.remove(&first.1);
    assert_eq!(reproduced(&got), others);
    no_temp_files(&dir);

    // A resumed campaign does not try a third time...
    let out = fuzz_with(&dir, &["--resume"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        journal(&dir).len(),
        got.len(),
        "nothing tried, nothing new to report"
    );
}

#[test]
fn a_minimization_a_killed_session_left_half_tried_is_tried_again_on_resume() {
    let (reference_dir, want) = reference("retry-reference");
    let first = want
        .iter()
        .find_map(|e| match e {
            Entry::Finding { signature, .. } => Some(signature.clone()),
            _ => None,
        })
        .unwrap();
    // One failed attempt journaled, the reproducer entry lost with the kill.
    let dir = scratch("retry-resumed");
    let mut text = String::new();
    for e in &want {
        let line = match e {
            Entry::Reproducer { signature, .. } if *signature == first => {
                serde_json::to_string(&Entry::Unminimized {
                    signature: first.clone(),
                    reason: Unminimized::WorkerDied,
                    message: "the worker process died of signal 9".into(),
                })
                .unwrap()
            }
            e => serde_json::to_string(e).unwrap(),
        };
        text.push_str(&line);
        text.push('\n');
    }
    std::fs::write(dir.join(JOURNAL_FILE), text).unwrap();
    // The other findings' reproducers are there (a resume minimizes again
    // the ones whose files are gone).
    std::fs::create_dir_all(dir.join("repro")).unwrap();
    for f in reproducer_files(&reference_dir) {
        if !f.starts_with(&first.slug()) {
            std::fs::copy(
                reference_dir.join("repro").join(&f),
                dir.join("repro").join(&f),
            )
            .unwrap();
        }
    }
    let out = fuzz_with(&dir, &["--resume"], &[]);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    let got = journal(&dir);
    assert_eq!(
        reproduced(&got),
        signatures(&got),
        "the second attempt minimized it"
    );
    assert_eq!(reproducer_files(&dir), reproducer_files(&reference_dir));
    // Only the half-tried one was minimized in this session.
    let count = |j: &[Entry]| {
        j.iter()
            .filter(|e| matches!(e, Entry::Reproducer { .. }))
            .count()
    };
    assert_eq!(count(&got), count(&want));
}

/// A child process of `pid`, once it has one (Linux).
#[cfg(target_os = "linux")]
fn worker_child(pid: u32) -> Option<u32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        let child = tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .find_map(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()));
        if child.is_some() {
            return child;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    None
}

/// Whether a process runs (gone and zombies do not).
#[cfg(target_os = "linux")]
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

/// The address-space limit of one of `pid`'s children, once it has one.
#[cfg(target_os = "linux")]
fn child_address_space_limit(pid: u32) -> Option<String> {
    let child = worker_child(pid)?;
    let limits = std::fs::read_to_string(format!("/proc/{child}/limits")).ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    line.split_whitespace().nth(3).map(str::to_string)
}

#[cfg(target_os = "linux")]
#[test]
fn a_killed_campaign_takes_its_workers_with_it() {
    let dir = scratch("orphans");
    // The worker hangs in its first run; the campaign is SIGKILLed meanwhile.
    let mut campaign = Command::new(binary())
        .args([
            "fuzz",
            "--runs",
            "3",
            "--quiet",
            "--out",
            dir.to_str().unwrap(),
        ])
        .env(nanhunt::campaign::workers::HANG_INDEX_ENV, "0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let worker = worker_child(campaign.id()).expect("the campaign starts a worker");
    campaign.kill().unwrap();
    campaign.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while running(worker) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!running(worker), "worker {worker} outlived its campaign");
}

/// A worker terminated from outside (a scheduler's SIGTERM) is not its
/// run's crash: the campaign stops with the run unjournaled, and
/// `--resume` runs it, ending with the journal of an uninterrupted run.
#[cfg(target_os = "linux")]
#[test]
fn a_worker_terminated_from_outside_is_no_crash_and_resume_runs_its_case() {
    let dir = scratch("terminated");
    let args = |d: &std::path::Path| {
        let mut v: Vec<String> = [
            "fuzz", "--runs", "3", "--seed", "3", "--jobs", "1", "--quiet", "--out",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.push(d.to_str().unwrap().to_string());
        v
    };
    // The worker hangs in its first run and is sent SIGTERM there.
    let campaign = Command::new(binary())
        .args(args(&dir))
        .env(nanhunt::campaign::workers::HANG_INDEX_ENV, "0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let worker = worker_child(campaign.id()).expect("the campaign starts a worker");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let term = Command::new("kill")
        .args(["-TERM", &worker.to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let out = campaign.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(
        !matches!(out.status.code(), Some(0 | 1)) && err.contains("terminated from outside"),
        "{:?}: {err}",
        out.status.code()
    );
    let crashes = journal(&dir)
        .iter()
        .filter(|e| {
            matches!(
                e,
                Entry::Run {
                    verdict: nanhunt::Verdict::Crash,
                    ..
                }
            )
        })
        .count();
    assert_eq!(
        crashes, 0,
        "a terminated worker's run is journaled as a crash"
    );
    // Resumed, it ends as the campaign run without interruption does.
    let resumed = Command::new(binary())
        .args(args(&dir))
        .arg("--resume")
        .output()
        .unwrap();
    assert!(
        matches!(resumed.status.code(), Some(0 | 1)),
        "{}",
        stderr(&resumed)
    );
    let whole = scratch("terminated-whole");
    let plain = Command::new(binary()).args(args(&whole)).output().unwrap();
    assert!(
        matches!(plain.status.code(), Some(0 | 1)),
        "{}",
        stderr(&plain)
    );
    assert_eq!(runs(&journal(&dir)), runs(&journal(&whole)));
}

#[test]
fn a_run_past_the_case_timeout_is_journaled_and_its_worker_replaced() {
    let dir = scratch("timeout");
    let child = Command::new(binary())
        .args([
            "fuzz",
            "--runs",
            "5",
            "--seed",
            "5",
            "--quiet",
            "--minimize-runs",
            "10",
        ])
        .args(["--case-timeout", "2s", "--max-memory-mib", "2048"])
        .args(["--out", dir.to_str().unwrap()])
        .env(nanhunt::campaign::workers::HANG_INDEX_ENV, "2")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Each worker is held to --max-memory-mib plus 1 GiB of address space.
    #[cfg(target_os = "linux")]
    assert_eq!(
        child_address_space_limit(child.id()).as_deref(),
        Some((3u64 << 30).to_string().as_str())
    );
    let out = child.wait_with_output().unwrap();
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    let entries = journal(&dir);
    let verdicts: Vec<(u64, nanhunt::Verdict, Option<String>)> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Run {
                index,
                verdict,
                message,
                ..
            } => Some((*index, *verdict, message.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(verdicts.len(), 5);
    for (index, verdict, message) in verdicts {
        if index == 2 {
            assert_eq!(verdict, "timeout");
            assert!(message.unwrap().contains("longer than 2 s"));
        } else {
            assert_ne!(verdict, "timeout", "run {index}");
        }
    }
    // A timeout is its own verdict wherever verdicts are counted.
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["timeouts"], 1, "{summary}");
    assert_eq!(summary["errors"], 0, "{summary}");
    assert!(
        stdout(&out).contains("0 errors, 1 timed out"),
        "{}",
        stdout(&out)
    );
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("| errors | timed out |"), "{md}");
    assert!(md.contains("| 0 | 1 |"), "{md}");
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.contains("<th>timed out</th>"), "{html}");
}

#[test]
fn two_processes_cannot_write_one_campaign() {
    let dir = scratch("locked");
    let (_journal, _) = nanhunt::journal::Journal::open(&dir).unwrap();
    let out = fuzz_with(&dir, &["--resume"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("another nanhunt process is writing"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn minimizations_left_by_a_killed_session_stay_within_the_next_sessions_budget() {
    let (reference_dir, want) = reference("budget-reference");
    // Killed before any minimization finished: no reproducer entries.
    let dir = scratch("budget-resumed");
    let text: String = want
        .iter()
        .filter(|e| !matches!(e, Entry::Reproducer { .. }))
        .map(|e| serde_json::to_string(e).unwrap() + "\n")
        .collect();
    std::fs::write(dir.join(JOURNAL_FILE), text).unwrap();
    // A spent budget: nothing is minimized, and the summary says so.
    let out = fuzz_with(&dir, &["--resume", "--budget", "0s"], &[]);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    assert!(reproduced(&journal(&dir)).is_empty());
    assert!(
        stdout(&out).contains("(not minimized yet: resume the campaign)"),
        "{}",
        stdout(&out)
    );
    // Without one, every pending finding is minimized.
    let out = fuzz_with(&dir, &["--resume"], &[]);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    assert_eq!(reproduced(&journal(&dir)), signatures(&want));
    assert_eq!(reproducer_files(&dir), reproducer_files(&reference_dir));
}
