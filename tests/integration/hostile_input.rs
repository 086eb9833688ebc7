//! Hostile input: numbers out of range, sizes that overflow, files that are
//! not files, corrupt journals. Each gets a clear error naming what was
//! wrong, exit 2, and never a panic or a hang.

use crate::support::*;
use nanhunt::journal::JOURNAL_FILE;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs nanhunt and expects exit 2 with every fragment in its error.
fn fails_with(args: &[&str], fragments: &[&str]) {
    let out = nanhunt(args);
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?}: {err}{}",
        stdout(&out)
    );
    for f in fragments {
        assert!(err.contains(f), "{args:?}: `{f}` not in: {err}");
    }
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

fn example_file(dir: &Path, family: &str) -> PathBuf {
    let path = dir.join(format!("{family}.json"));
    std::fs::write(&path, nanhunt::Case::example(family).unwrap().to_json()).unwrap();
    path
}

#[test]
fn numbers_out_of_range_are_refused_with_the_option_named() {
    let dir = scratch("hostile-numbers");
    let case = example_file(&dir, "cnn");
    let case = case.to_str().unwrap();
    let out = dir.join("campaign");
    let out = out.to_str().unwrap();
    fails_with(
        &["fuzz", "--budget", "1e30", "--out", out],
        &["--budget", "100 years"],
    );
    fails_with(
        &["fuzz", "--jobs", "100000", "--out", out],
        &["--jobs", "1..=1024"],
    );
    fails_with(
        &["fuzz", "--max-steps", "0", "--out", out],
        &["--max-steps", "3..=100000"],
    );
    fails_with(
        &["fuzz", "--case-timeout", "0s", "--out", out],
        &["--case-timeout"],
    );
    fails_with(
        &["diff", case, "--threads", "1,100000"],
        &["--threads", "1..=1024"],
    );
    fails_with(
        &["run", case, "--max-memory-mib", "17592186044416"],
        &["--max-memory-mib", "1..=16777216"],
    );
    let digits = "corpora/datasets/digits/digits.safetensors";
    fails_with(
        &["scan-data", digits, "--threads", "0"],
        &["--threads", "1..=1024"],
    );
    fails_with(&["lr-table", "--seeds", "0"], &["--seeds"]);
    fails_with(&["minimize", case, "--max-runs", "0"], &["--max-runs"]);
    assert!(!Path::new(out).exists(), "nothing was started");
}

#[test]
fn a_case_whose_batch_does_not_fit_in_memory_is_rejected_before_it_allocates() {
    // 64 × 512 × 512 inputs at batch 255: 17 GB of batch alone, which the
    // estimate once left out (it said 4080 MiB).
    let dir = scratch("hostile-memory");
    let mut case: serde_json::Value =
        serde_json::to_value(nanhunt::Case::example("cnn").unwrap()).unwrap();
    case["model"]["channels"] = 64.into();
    case["model"]["height"] = 512.into();
    case["model"]["width"] = 512.into();
    case["batch_size"] = 255.into();
    let path = dir.join("big.json");
    std::fs::write(&path, case.to_string()).unwrap();
    fails_with(
        &["run", path.to_str().unwrap()],
        &[
            "big.json",
            "estimated memory",
            "exceeds the limit of 4096 MiB",
        ],
    );
}

#[test]
fn paths_that_are_not_regular_files_fail_at_once() {
    fails_with(&["run", "/dev/zero"], &["/dev/zero", "not a regular file"]);
    let dir = scratch("hostile-fifo");
    let fifo = dir.join("case.json");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // A FIFO nobody writes to: reading it would block forever.
    let mut child = Command::new(binary())
        .args(["run", fifo.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("`run FIFO` hangs");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(2));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("not a regular file"), "{err}");
}

#[test]
fn a_missing_file_is_named_once() {
    let out = nanhunt(&["run", "no/such/case.json"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(err.matches("no/such/case.json").count(), 1, "{err}");
}

#[test]
fn a_stable_run_asked_for_a_dump_says_there_is_none_and_replay_says_why() {
    let dir = scratch("no-dump");
    let case = example_file(&dir, "cnn");
    let scene = dir.join("scene");
    let out = nanhunt(&[
        "run",
        case.to_str().unwrap(),
        "--dump",
        scene.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("no crash dump in"),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains("--dump-at STEP"), "{}", stdout(&out));
    let out = nanhunt(&["replay", scene.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--dump-at STEP"), "{err}");
    assert_eq!(err.matches(scene.to_str().unwrap()).count(), 1, "{err}");
}

#[test]
fn corrupt_journals_are_journal_errors_with_the_line() {
    let dir = scratch("hostile-journal");
    let out = nanhunt(&[
        "fuzz",
        "--runs",
        "3",
        "--seed",
        "5",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    // Another campaign's options are an option error, not a case error.
    let d = dir.to_str().unwrap();
    fails_with(
        &[
            "fuzz", "--runs", "3", "--seed", "6", "--quiet", "--resume", "--out", d,
        ],
        &[
            "invalid option `resume`",
            "journal.jsonl",
            "another campaign: seed 5 (not 6)",
        ],
    );
    let path = dir.join(JOURNAL_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[1] = "{\"event\":\"run\",\"index\":\"zero\"}";
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    fails_with(
        &[
            "fuzz", "--runs", "3", "--seed", "5", "--quiet", "--resume", "--out", d,
        ],
        &["cannot parse journal", "journal.jsonl", "line 2"],
    );
    fails_with(&["report", d], &["cannot parse journal", "line 2"]);
}

#[test]
fn a_journal_whose_finding_holds_an_invalid_case_does_not_resume() {
    let dir = scratch("hostile-finding");
    let d = dir.to_str().unwrap();
    let out = nanhunt(&[
        "fuzz",
        "--runs",
        "24",
        "--seed",
        "5",
        "--quiet",
        "--minimize-runs",
        "10",
        "--out",
        d,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let path = dir.join(JOURNAL_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    let edited: Vec<String> = text
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            if v["event"] == "finding" {
                v["case"]["batch_size"] = 0.into();
            }
            v.to_string()
        })
        .collect();
    std::fs::write(&path, edited.join("\n") + "\n").unwrap();
    fails_with(
        &[
            "fuzz", "--runs", "24", "--seed", "5", "--quiet", "--resume", "--out", d,
        ],
        &[
            "cannot parse journal",
            "holds an invalid case",
            "batch_size",
        ],
    );
}

#[test]
fn minimize_checks_its_output_before_it_starts() {
    let dir = scratch("hostile-minimize-out");
    let case = example_file(&dir, "cnn");
    // The example trains stably: a check after the minimization would
    // never come (exit 0, "nothing to minimize").
    fails_with(
        &[
            "minimize",
            case.to_str().unwrap(),
            "--out",
            dir.to_str().unwrap(),
        ],
        &["--out", "is a directory"],
    );
}

/// A `.npy` file: version-1 header for `shape` of little-endian f32, then
/// `data` (which may hold fewer values than the shape says).
fn npy(path: &Path, shape: &str, data: &[f32]) {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    for v in data {
        bytes.extend(v.to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

/// nanhunt under a 3 GiB address-space limit (`ulimit -v`): an allocation
/// a header declares would abort the process instead of failing cleanly.
fn limited(args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg("-c")
        .arg("ulimit -v 3145728 && exec \"$0\" \"$@\"")
        .arg(binary())
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn data_files_that_declare_more_than_they_hold_are_refused_before_they_allocate() {
    let dir = scratch("hostile-npy");
    // 13 bytes whose version-2 header declares 4 GiB.
    let huge_header = dir.join("huge_header.npy");
    let mut bytes = b"\x93NUMPY\x02\x00".to_vec();
    bytes.extend(u32::MAX.to_le_bytes());
    bytes.push(b'x');
    std::fs::write(&huge_header, bytes).unwrap();
    // A valid header for 2^40 samples, and no data.
    let huge_shape = dir.join("huge_shape.npy");
    npy(&huge_shape, "(1099511627776, 4)", &[]);
    let empty = dir.join("empty.npy");
    npy(&empty, "(0, 4)", &[]);
    let cases = [
        (
            &huge_header,
            "its header declares 4294967295 bytes, but the file has 1",
        ),
        (&huge_shape, "its header declares shape [1099511627776, 4]"),
        (&empty, "it holds no samples"),
    ];
    for (file, reason) in cases {
        let f = file.to_str().unwrap();
        let out = limited(&["scan-data", f, "--no-labels"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{f}: {err}");
        assert!(err.contains(f) && err.contains(reason), "{f}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("memory allocation"),
            "{err}"
        );
    }
    // Inputs alone scan (training would need labels or targets).
    let inputs = dir.join("inputs.npy");
    npy(&inputs, "(3, 2)", &[1.0, 2.0, f32::NAN, 4.0, 5.0, 6.0]);
    let out = limited(&["scan-data", inputs.to_str().unwrap(), "--no-labels"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stdout(&out).contains("3 samples"), "{}", stdout(&out));
    // Without a flag too: no labels of the default name, the inputs alone.
    let out = limited(&["scan-data", inputs.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stdout(&out).contains("3 samples"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("its inputs are scanned alone"),
        "{}",
        stderr(&out)
    );
    // Labels named and missing are still an error.
    let out = limited(&["scan-data", inputs.to_str().unwrap(), "--labels", "lab"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// Runs nanhunt as the one child of a Python parent and returns its
/// output with its peak resident memory in MiB (`getrusage` of the
/// parent's children: only this process counts).
fn with_peak_memory(args: &[&str]) -> (std::process::Output, f64) {
    // Tests measure at once: each call gets a directory of its own.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = scratch(&format!("peak-memory-{n}"));
    let rss = dir.join("rss");
    let script = "import resource, subprocess, sys\n\
                  r = subprocess.run(sys.argv[2:])\n\
                  open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n\
                  sys.exit(r.returncode)";
    let out = Command::new("python3")
        .args(["-c", script, rss.to_str().unwrap()])
        .arg(binary())
        .args(args)
        .output()
        .expect("python3 runs the memory probe");
    let kib: f64 = std::fs::read_to_string(&rss)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (out, kib / 1024.0)
}

/// `scan-data FILE --no-labels` at a 16 MiB limit, as JSON: it finds a
/// problem (exit 1) and holds at most 48 MiB while it does.
fn bounded_scan(file: &Path) -> serde_json::Value {
    let f = file.to_str().unwrap();
    let args = [
        "scan-data",
        f,
        "--no-labels",
        "--max-memory-mib",
        "16",
        "--report",
        "json",
    ];
    let (out, peak) = with_peak_memory(&args);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        peak <= 48.0,
        "scan-data held {peak:.1} MiB of {f} at --max-memory-mib 16"
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn scan_data_memory_does_not_grow_with_the_sample_count() {
    let dir = scratch("scan-bounded");
    // 4M one-value samples, all distinct but every 100th a copy of the one
    // before it, and three NaNs: an exact duplicate table alone would take
    // 64 MiB.
    let n = 1usize << 22;
    let values: Vec<f32> = (0..n)
        .map(|i| match i {
            7 | 70_000 | 4_000_000 => f32::NAN,
            i if i % 100 == 99 => (i - 1) as f32,
            i => i as f32,
        })
        .collect();
    let file = dir.join("many.npy");
    npy(&file, &format!("({n}, 1)"), &values);
    let scan = bounded_scan(&file);
    assert_eq!(scan["samples"], n);
    let problem = |kind: &str| {
        scan["problems"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["kind"] == kind)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} in {scan}"))
    };
    assert_eq!(problem("nan")["count"], 3);
    assert_eq!(
        problem("nan")["indices"],
        serde_json::json!([7, 70_000, 4_000_000])
    );
    // Duplicates are estimated past the table, within the error stated.
    let sketch = &scan["sketches"]["duplicates"];
    assert_eq!(sketch["exact"], false, "{sketch}");
    // Every 100th sample, and the two NaN samples after the first (equal bits).
    let truth = (n / 100 + 2) as f64;
    let estimated = problem("duplicate_sample")["count"].as_f64().unwrap();
    let error = sketch["relative_error"].as_f64().unwrap();
    assert!(
        (estimated - truth).abs() <= error * truth,
        "estimated {estimated} duplicates of {truth}, ±{error}"
    );
}

#[test]
fn a_csv_line_past_its_bound_and_an_inflating_archive_stay_within_the_limit() {
    let dir = scratch("hostile-csv-npz");
    // One 2 MiB line: at a 16 MiB limit a record is bounded to 1 MiB.
    let csv = dir.join("long_line.csv");
    let mut text = String::from("x,label\n1,0\n");
    text.push_str(&"1".repeat(2 << 20));
    text.push_str(",0\n");
    std::fs::write(&csv, text).unwrap();
    let c = csv.to_str().unwrap();
    let out = limited(&[
        "scan-data",
        c,
        "--labels",
        "label",
        "--max-memory-mib",
        "16",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(csv.to_str().unwrap()) && err.contains("line 3 is longer than 1 MiB"),
        "{err}"
    );
    // A 256 MiB array of zeros deflated to a fraction of a MiB: scanned in
    // bounded memory, every sample all-zero.
    let npz = dir.join("bomb.npz");
    let script = "import sys, zipfile\n\
                  n, f = 1 << 20, 64\n\
                  h = \"{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }\" % (n, f)\n\
                  h += ' ' * ((64 - (10 + len(h) + 1) % 64) % 64) + '\\n'\n\
                  with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as z:\n\
                  \x20   with z.open('inputs.npy', 'w', force_zip64=True) as m:\n\
                  \x20       m.write(b'\\x93NUMPY\\x01\\x00' + len(h).to_bytes(2, 'little') + h.encode())\n\
                  \x20       block = bytes(1 << 20)\n\
                  \x20       for _ in range(n * f * 4 >> 20): m.write(block)\n";
    let made = Command::new("python3")
        .args(["-c", script, npz.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(made.success());
    assert!(std::fs::metadata(&npz).unwrap().len() < 2 << 20);
    let scan = bounded_scan(&npz);
    assert_eq!(scan["problems"][0]["kind"], "all_zero_sample");
    assert_eq!(scan["problems"][0]["count"], 1 << 20);
}

#[test]
fn an_unterminated_quote_and_an_oversized_header_are_refused_within_the_limit() {
    let dir = scratch("hostile-quote-header");
    // A quote opened on line 3 and never closed: 48 MiB of short lines
    // that the parser would buffer as one field.
    let csv = dir.join("quote.csv");
    let mut text = String::from("x,label\n1,0\n\"");
    text.push_str(&"1,0\n".repeat(12 << 20));
    std::fs::write(&csv, text).unwrap();
    // A safetensors file whose header (its JSON index) is 24 MiB.
    let st = dir.join("header.safetensors");
    let header = format!(
        "{{\"__metadata__\":{{\"pad\":\"{}\"}},\"inputs\":{{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[0,8]}}}}",
        "x".repeat(24 << 20)
    );
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend([0u8; 8]);
    std::fs::write(&st, bytes).unwrap();
    let cases = [
        (&csv, "the quoted field opened on line 3 runs past 1 MiB"),
        (&st, "its header is 24 MiB, past 1 MiB"),
    ];
    for (file, reason) in cases {
        let f = file.to_str().unwrap();
        let args = ["scan-data", f, "--no-labels", "--max-memory-mib", "16"];
        let out = limited(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{f}: {err}");
        assert!(err.contains(f) && err.contains(reason), "{f}: {err}");
        let (out, peak) = with_peak_memory(&args);
        assert_eq!(out.status.code(), Some(2), "{f}: {}", stderr(&out));
        assert!(peak < 48.0, "{f}: {peak:.0} MiB at a 16 MiB limit");
    }
    // `run` on a CSV dataset whose record runs past the bound: refused
    // while it reads, within the limit.
    let small = dir.join("quote_small.csv");
    let mut text = String::from("x,label\n1,0\n\"");
    text.push_str(&"1,0\n".repeat(3 << 20));
    std::fs::write(&small, text).unwrap();
    let mut case: serde_json::Value =
        serde_json::from_slice(&nanhunt(&["example"]).stdout).unwrap();
    case["data"]["source"] =
        serde_json::json!({"kind": "file", "path": small.to_str().unwrap(), "labels": "label"});
    let case_path = dir.join("case.json");
    std::fs::write(&case_path, case.to_string()).unwrap();
    let c = case_path.to_str().unwrap();
    let args = ["run", c, "--max-memory-mib", "16"];
    let out = limited(&args);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("runs past 1 MiB"), "{}", stderr(&out));
    let (_, peak) = with_peak_memory(&args);
    assert!(peak < 64.0, "run: {peak:.0} MiB at a 16 MiB limit");
}

#[test]
fn a_campaign_starts_under_a_hard_address_space_limit_below_its_workers_limit() {
    let dir = scratch("ulimit-campaign");
    let out = dir.join("runs");
    // Workers would get 3 GiB + 1 GiB of headroom, over the 3 GiB hard limit.
    let o = limited(&[
        "fuzz",
        "--runs",
        "3",
        "--quiet",
        "--max-memory-mib",
        "3072",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = stderr(&o);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{err}");
    assert!(
        err.contains("ulimit -v") && err.contains("workers run under 3072 MiB"),
        "{err}"
    );
    assert!(out.join("summary.json").is_file());
}
