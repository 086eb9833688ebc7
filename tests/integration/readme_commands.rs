//! The README's shell commands, run as written: every `nanhunt …` line of
//! its `sh` blocks, the `cargo run -p nanhunt -- …` ones (the main command
//! first) and the user-model example's `cargo run --example NAME -- …`, in
//! order, in one scratch directory beside the repository's corpora, as a
//! new user would type them (on the debug build the suite built). Each must exit 0 or 1 (2 is bad input, and
//! anything else a crash) without an error. The few that cannot run here
//! are listed with the reason, and a command in neither list fails the
//! test, so a new README command is run or explicitly excused.

use crate::support::*;
use std::process::Command;

/// Commands that cannot run in the test suite, by a fragment, and why.
const EXCUSED: &[(&str, &str)] = &[
    ("--budget 15m", "a 15-minute campaign"),
    ("--device cuda", "needs a CUDA build and a GPU"),
    ("--devices cpu,cuda", "needs a CUDA build and a GPU"),
    ("crash-…", "names a libFuzzer artifact by placeholder"),
];

/// The README's commands: `nanhunt` lines of its `sh` blocks, without
/// their comments, the main command's `cargo run -p nanhunt --` as `nanhunt`.
fn readme_commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_sh = !in_sh && t == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let command = t.split(" #").next().unwrap_or("").trim();
        let command = match (
            command.strip_prefix("cargo run -p nanhunt -- "),
            command.strip_prefix("cargo run --example "),
        ) {
            (Some(rest), _) => format!("nanhunt {rest}"),
            (_, Some(rest)) => format!("example:{rest}"),
            _ => command.to_string(),
        };
        if command.starts_with("nanhunt ") || command.starts_with("example:") {
            out.push(command);
        }
    }
    out
}

#[test]
fn every_readme_command_runs_as_written() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let commands = readme_commands(&readme);
    assert!(commands.len() >= 20, "{commands:?}");
    assert!(
        commands[0] == "nanhunt fuzz --resume",
        "the main command comes first"
    );
    let dir = scratch("readme-commands");
    std::os::unix::fs::symlink(root().join("corpora"), dir.join("corpora")).unwrap();
    let user_crate = dir.join("my-crate");
    std::fs::create_dir(&user_crate).unwrap();
    let bin = binary();
    let mut ran = 0;
    for command in &commands {
        if let Some((_, why)) = EXCUSED.iter().find(|(f, _)| command.contains(f)) {
            eprintln!("excused ({why}): {command}");
            continue;
        }
        // A shell, for the README's redirections (`> case.json`).
        let (line, cwd) = match command.strip_prefix("example:") {
            // The README's `my_model` is the user's crate's example; this
            // repository's is `user_model`, run in a crate directory of its own.
            Some(rest) => {
                let (name, args) = rest
                    .split_once(" -- ")
                    .expect("cargo run --example NAME -- ARGS");
                let name = if name == "my_model" {
                    "user_model"
                } else {
                    name
                };
                let line = format!("'{}' {args}", example_binary(name).display());
                (line, user_crate.as_path())
            }
            None => (
                command.replacen("nanhunt", &format!("'{}'", bin.display()), 1),
                &*dir,
            ),
        };
        let out = Command::new("sh")
            .arg("-c")
            .arg(&line)
            .current_dir(cwd)
            .output()
            .unwrap();
        let err = stderr(&out);
        assert!(
            matches!(out.status.code(), Some(0 | 1)) && !err.contains("error:"),
            "`{command}` exited {:?}:\n{err}{}",
            out.status.code(),
            stdout(&out)
        );
        ran += 1;
    }
    assert!(ran >= 20, "ran {ran}");
    // No excuse outlives its command.
    for (fragment, _) in EXCUSED {
        assert!(
            commands.iter().any(|c| c.contains(fragment)),
            "`{fragment}` excuses no README command"
        );
    }
}
