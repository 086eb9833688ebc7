//! Nothing lost, part 3: a campaign whose directory is deleted under it
//! stops with exit 2 and writes nothing where it was; a hunt replaces a
//! reproducer only by a complete new one, whatever write a kill stops,
//! and takes its output directory's lock as campaigns do.

use crate::support::*;
use nanhunt::journal::JOURNAL_FILE as JOURNAL;
use std::path::Path;
use std::process::{Command, Output};

/// Asserts that `o`'s stderr says `text`.
fn said(o: &Output, text: &str) {
    assert!(stderr(o).contains(text), "{}", stderr(o));
}

/// The names in `dir` that a writer's temp file or directory has.
fn temps(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect()
}

#[test]
fn a_campaign_whose_directory_is_deleted_under_it_stops_with_exit_2_and_writes_nothing_there() {
    let root = scratch("deleted-under");
    let out = root.join("campaign");
    let child = Command::new(binary())
        .args([
            "fuzz", "--runs", "100000", "--jobs", "1", "--quiet", "--out",
        ])
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Deleted once the campaign has journaled some runs.
    let journal = out.join(nanhunt::journal::JOURNAL_FILE);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::fs::read_to_string(&journal).map_or(0, |t| t.lines().count()) < 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "the campaign journaled nothing"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // A worker may add a reproducer while the directory is removed: retry.
    while out.exists() {
        let _ = std::fs::remove_dir_all(&out);
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o)
            .contains("the campaign directory was deleted or replaced while the campaign ran"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists(), "the campaign wrote where its directory was");
    // What is left says what happened.
    let o = nanhunt(&["report", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    said(&o, "no campaign directory there (was it deleted?)");
    std::fs::create_dir_all(out.join("repro")).unwrap();
    std::fs::write(out.join("repro/left.json"), "{}").unwrap();
    let o = nanhunt(&["report", out.to_str().unwrap()]);
    said(&o, "but no journal: the journal was deleted");
    let o = nanhunt(&[
        "fuzz",
        "--runs",
        "2",
        "--quiet",
        "--resume",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
    said(&o, "holds no campaign journal to resume");
    said(&o, "left.json is no journaled reproducer");
}

/// The `user_model` example's hunt into `dir/hunt`, with `env`.
fn hunt_in(exe: &Path, dir: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(exe);
    cmd.args(["hunt", "--out", "hunt", "--no-drift"])
        .current_dir(dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The reproducers under `dir/hunt/reproducers`, temp names aside.
fn reproducers(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("hunt/reproducers"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    names
}

#[test]
fn a_hunt_killed_at_any_write_of_a_reproducers_replacement_leaves_one_that_replays() {
    let exe = example_binary("user_model");
    let dir = scratch("hunt-kills");
    let o = hunt_in(&exe, &dir, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let names = reproducers(&dir);
    assert_eq!(names.len(), 1, "{names:?}");
    let repro = format!("hunt/reproducers/{}", names[0]);
    for point in ["filled", "exchanged", "removing"] {
        let o = hunt_in(&exe, &dir, &[(nanhunt::files::ABORT_IN_REPLACE_ENV, point)]);
        assert_eq!(o.status.code(), None, "{point}: not killed: {}", stderr(&o));
        // Whatever write the kill stopped, the reproducer is whole.
        assert_eq!(reproducers(&dir), names, "{point}");
        let o = Command::new(&exe)
            .args(["replay", &repro])
            .current_dir(&*dir)
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{point}: {}{}",
            stdout(&o),
            stderr(&o)
        );
        assert!(stdout(&o).contains("reproduced"), "{point}: {}", stdout(&o));
    }
    // The next hunt removes what the killed ones left, and replaces it.
    let o = hunt_in(&exe, &dir, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(reproducers(&dir), names);
    for sub in ["hunt", "hunt/reproducers"] {
        assert!(
            temps(&dir.join(sub)).is_empty(),
            "{sub}: {:?}",
            temps(&dir.join(sub))
        );
    }
}

#[test]
fn a_hunt_is_refused_an_output_directory_another_process_writes() {
    let exe = example_binary("user_model");
    let dir = scratch("hunt-locked");
    std::fs::create_dir_all(dir.join("hunt")).unwrap();
    // Another hunt, or a campaign, holds the directory's lock.
    let lock = nanhunt::journal::lock_dir(&dir.join("hunt")).unwrap();
    let o = hunt_in(&exe, &dir, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    said(
        &o,
        "another nanhunt process is writing this output directory",
    );
    assert!(!dir.join("hunt/risk.md").exists());
    drop(lock);
    let o = hunt_in(&exe, &dir, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
}

#[test]
fn a_hunt_past_its_budget_reports_the_stages_it_did_not_search() {
    let exe = example_binary("user_model");
    let dir = scratch("hunt-budget");
    let o = Command::new(&exe)
        .args(["hunt", "--out", "hunt", "--budget", "0s", "--json"])
        .current_dir(&*dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let stages = report["stages"].as_array().unwrap();
    assert!(!stages.is_empty());
    for s in stages {
        assert_eq!(s["status"], "not_searched", "{s}");
        assert!(
            s["why"].as_str().unwrap().contains("time budget ran out"),
            "{s}"
        );
    }
    let o = Command::new(&exe)
        .args(["hunt", "--out", "hunt", "--case-timeout", "0s"])
        .current_dir(&*dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    said(&o, "--case-timeout");
}

#[test]
fn a_case_that_does_not_fit_a_users_model_is_refused_naming_the_field() {
    let exe = example_binary("user_model");
    let dir = scratch("unfit-case");
    let own: serde_json::Value =
        serde_json::from_slice(&Command::new(&exe).arg("example").output().unwrap().stdout)
            .unwrap();
    let variants = [
        (
            "input",
            serde_json::json!({"kind": "tokens", "seq_len": 8, "vocab": 32}),
            "model.input.kind",
        ),
        (
            "input",
            serde_json::json!({"kind": "vector", "features": 12}),
            "model.input",
        ),
        ("outputs", serde_json::json!(7), "model.outputs"),
        ("per_token", serde_json::json!(true), "model.per_token"),
    ];
    for (key, value, field) in variants {
        let mut case = own.clone();
        case["model"][key] = value;
        let path = dir.join(format!("{}.json", field.replace('.', "_")));
        std::fs::write(&path, serde_json::to_string(&case).unwrap()).unwrap();
        for command in ["run", "hunt"] {
            let o = Command::new(&exe)
                .arg(command)
                .arg(&path)
                .current_dir(&*dir)
                .env("RUST_BACKTRACE", "0")
                .output()
                .unwrap();
            let all = format!("{}{}", stdout(&o), stderr(&o));
            assert_eq!(o.status.code(), Some(2), "{command} {field}: {all}");
            let said = format!("field `{field}`:");
            assert_eq!(all.matches(&said).count(), 1, "{command} {field}: {all}");
            assert!(!all.contains("panicked"), "{command} {field}: {all}");
        }
    }
}

/// A change made to a copy of a scene.
type Change = Box<dyn Fn(&Path)>;

#[test]
fn replay_refuses_a_scene_whose_batch_dtypes_or_case_were_changed() {
    let exe = example_binary("user_model");
    let dir = scratch("replay-tampered");
    let o = hunt_in(&exe, &dir, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let name = reproducers(&dir).remove(0);
    let original = dir.join("hunt/reproducers").join(&name);
    let replay = |scene: &Path| {
        Command::new(&exe)
            .arg("replay")
            .arg(scene)
            .current_dir(&*dir)
            .output()
            .unwrap()
    };
    let o = replay(&original);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    // A copy of the scene with one thing changed.
    let tampered = |label: &str, change: &dyn Fn(&Path)| {
        let copy = dir.join(label);
        std::fs::create_dir_all(&copy).unwrap();
        for f in std::fs::read_dir(&original).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), copy.join(f.file_name())).unwrap();
        }
        change(&copy);
        copy
    };
    let case_edit = |edit: fn(&mut serde_json::Value)| {
        move |d: &Path| {
            let path = d.join("case.json");
            let mut case: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            edit(&mut case);
            std::fs::write(&path, serde_json::to_string(&case).unwrap()).unwrap();
        }
    };
    let recast = |tensor: &'static str, dtype: candle_core::DType| {
        move |d: &Path| {
            let path = d.join("scene.safetensors");
            let mut all = candle_core::safetensors::load(&path, &candle_core::Device::Cpu).unwrap();
            let t = all[tensor].to_dtype(dtype).unwrap();
            all.insert(tensor.to_string(), t);
            candle_core::safetensors::save(&all, &path).unwrap();
        }
    };
    let cases: Vec<(&str, Change, &str)> = vec![
        (
            "batch-size",
            Box::new(case_edit(|c| c["batch_size"] = serde_json::json!(8))),
            "field `batch_size`",
        ),
        (
            "optimizer",
            Box::new(case_edit(|c| c["optimizer"]["lr"] = serde_json::json!(0.1))),
            "field `optimizer`",
        ),
        (
            "u8-labels",
            Box::new(recast("source/labels", candle_core::DType::U8)),
            "tensor `source/labels`: dtype U8",
        ),
        (
            "f64-inputs",
            Box::new(recast("source/inputs", candle_core::DType::F64)),
            "tensor `source/inputs`: dtype F64",
        ),
    ];
    for (label, change, said) in cases {
        let o = replay(&tampered(label, &*change));
        assert_eq!(
            o.status.code(),
            Some(2),
            "{label}: {}{}",
            stdout(&o),
            stderr(&o)
        );
        assert!(stderr(&o).contains(said), "{label}: {}", stderr(&o));
    }
}

/// A shard of a 2-shard campaign of `seed` in `dir`.
fn shard(dir: &Path, index: usize, seed: u64) {
    let o = nanhunt(&[
        "fuzz",
        "--runs",
        "12",
        "--shard",
        &format!("{index}/2"),
        "--seed",
        &seed.to_string(),
        "--quiet",
        "--minimize-runs",
        "20",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
}

/// A copy of directory `from` at `to`, one level of subdirectories deep.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn merge(inputs: &[&Path], out: &Path, env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new(binary());
    cmd.arg("merge").args(inputs).arg("--out").arg(out);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn merge_refuses_what_a_resume_refuses_and_is_redone_after_a_kill_at_any_write() {
    let root = scratch("merge-checks");
    let (a, b, other) = (root.join("a"), root.join("b"), root.join("other"));
    shard(&a, 0, 2);
    shard(&b, 1, 2);
    shard(&other, 1, 6);
    let journal_of = |d: &Path| std::fs::read_to_string(d.join(JOURNAL)).unwrap();
    // Copies of shard a, each changed in one way.
    let changed = |name: &str, change: &dyn Fn(&Path)| {
        let dir = root.join(name);
        copy_dir(&a, &dir);
        change(&dir);
        dir
    };
    let no_start = changed("no-start", &|d| {
        let text = journal_of(d);
        std::fs::write(d.join(JOURNAL), text.split_once('\n').unwrap().1).unwrap();
    });
    let empty = changed("empty", &|d| std::fs::write(d.join(JOURNAL), "").unwrap());
    let outside = changed("outside", &|d| {
        let text = journal_of(d).replacen("\"index\":0,", "\"index\":1,", 1);
        std::fs::write(d.join(JOURNAL), text).unwrap();
    });
    let mut repros: Vec<_> = std::fs::read_dir(a.join("repro"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    repros.sort();
    assert!(repros.len() >= 2, "{repros:?}");
    let name = |p: &Path| p.file_name().unwrap().to_owned();
    let (r0, r1) = (name(&repros[0]), name(&repros[1]));
    let truncated = changed("truncated", &|d| {
        let p = d.join("repro").join(&r0);
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, &text[..text.len() / 2]).unwrap();
    });
    let swapped = changed("swapped", &|d| {
        let (p0, p1) = (d.join("repro").join(&r0), d.join("repro").join(&r1));
        let (t0, t1) = (std::fs::read(&p0).unwrap(), std::fs::read(&p1).unwrap());
        std::fs::write(&p0, t1).unwrap();
        std::fs::write(&p1, t0).unwrap();
    });
    let refusals: Vec<(Vec<&Path>, &str)> = vec![
        (vec![&a, &no_start], "its journal has no start line"),
        (vec![&a, &empty], "its journal has no start line"),
        (vec![&a, &other], "comes from another campaign"),
        (vec![&a, &a], "is shard 0 of 2 again"),
        (vec![&outside, &b], "run 1 is not in its shard (0 of 2)"),
        (vec![&truncated, &b], "reproducer"),
        (vec![&swapped, &b], "is the reproducer of"),
    ];
    for (k, (inputs, said)) in refusals.iter().enumerate() {
        let out = root.join(format!("refused-{k}"));
        let o = merge(inputs, &out, &[]);
        assert_eq!(o.status.code(), Some(2), "{said}: {}", stderr(&o));
        assert!(stderr(&o).contains(said), "{said}: {}", stderr(&o));
        assert!(!out.join(JOURNAL).exists(), "{said}");
    }
    assert!(stderr(&merge(&[&a, &other], &root.join("x"), &[])).contains("seed 6 (not 2)"));

    // The merge uninterrupted, then killed before each of its writes and
    // run again: the same journal and exit code, no temp file left.
    let reference = root.join("merged");
    let o = merge(&[&a, &b], &reference, &[]);
    let code = o.status.code();
    assert!(matches!(code, Some(0 | 1)), "{}", stderr(&o));
    let writes = std::fs::read_dir(reference.join("repro")).unwrap().count() + 3;
    for k in 0..writes {
        let out = root.join(format!("killed-{k}"));
        let env = [(nanhunt::merge::ABORT_BEFORE_WRITE_ENV, k.to_string())];
        let o = merge(&[&a, &b], &out, &env);
        assert_eq!(
            o.status.code(),
            None,
            "write {k}: not killed: {}",
            stderr(&o)
        );
        let o = merge(&[&a, &b], &out, &[]);
        assert_eq!(o.status.code(), code, "write {k}: {}", stderr(&o));
        assert_eq!(journal_of(&out), journal_of(&reference), "write {k}");
        for sub in [out.clone(), out.join("repro")] {
            assert!(temps(&sub).is_empty(), "write {k}: {:?}", temps(&sub));
        }
    }
}

#[test]
fn a_resumed_campaign_lists_only_the_reproducers_it_holds_and_refuses_zero_runs() {
    let root = scratch("resume-reproducers");
    let out = root.join("campaign");
    shard(&out, 0, 2);
    let repro = out.join("repro");
    let mut files: Vec<String> = std::fs::read_dir(&repro)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert!(!files.is_empty());
    // One reproducer deleted, one file no entry names.
    std::fs::remove_file(repro.join(&files[0])).unwrap();
    std::fs::write(repro.join("stale.json"), "{}").unwrap();
    let o = nanhunt(&[
        "fuzz",
        "--runs",
        "12",
        "--shard",
        "0/2",
        "--seed",
        "2",
        "--quiet",
        "--minimize-runs",
        "20",
        "--resume",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
    said(&o, "is gone: it is minimized again");
    said(&o, "stale.json is no journaled reproducer");
    assert!(!repro.join("stale.json").exists());
    // Every reproducer the report names is there, the deleted one again.
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(repro.join(&files[0]).is_file(), "not minimized again");
    for f in std::fs::read_dir(&repro).unwrap() {
        let name = f.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            report.contains(&name) || name.starts_with('.'),
            "{name} unlisted"
        );
    }
    let o = nanhunt(&[
        "fuzz",
        "--runs",
        "0",
        "--out",
        root.join("zero").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    said(&o, "--runs");
}

#[test]
fn a_hunt_refuses_the_file_systems_root_as_its_output_before_anything_else() {
    let dir = scratch("hunt-root");
    let root = dir.join("root");
    std::os::unix::fs::symlink("/", &root).unwrap();
    // The case does not exist: had the root been taken, this still writes nothing.
    let o = nanhunt(&["hunt", "missing.json", "--out", root.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    said(&o, "the file system's root is no output directory");
}
