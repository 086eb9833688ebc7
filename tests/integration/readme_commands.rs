//! The README's shell commands (and the reference pages', in
//! `support::USER_PAGES` order), run as written: every `nanhunt …` line of
//! their `sh` blocks, the `cargo run -p nanhunt -- …` ones (the main command
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

/// What a page asks to run: a command of an `sh` block, or the command of
/// a pasted output (a plain block whose first line is `$ COMMAND`) with the
/// lines it must print, in that order ("…" stands for lines left out).
enum Item {
    Run(String),
    Pasted { command: String, lines: Vec<String> },
}

impl Item {
    fn command(&self) -> &str {
        match self {
            Item::Run(c) | Item::Pasted { command: c, .. } => c,
        }
    }
}

/// A shell line as the test runs it: `nanhunt …`, the main command's
/// `cargo run -p nanhunt --` as `nanhunt`, an example's `cargo run
/// --example NAME --` as `example:NAME …`; without its comment.
fn as_command(line: &str) -> Option<String> {
    let command = line.split(" #").next().unwrap_or("").trim();
    let command = match (
        command.strip_prefix("cargo run -p nanhunt -- "),
        command.strip_prefix("cargo run --example "),
    ) {
        (Some(rest), _) => format!("nanhunt {rest}"),
        (_, Some(rest)) => format!("example:{rest}"),
        _ => command.to_string(),
    };
    (command.starts_with("nanhunt ") || command.starts_with("example:")).then_some(command)
}

/// A page's commands and pasted outputs, in order.
fn readme_commands(text: &str) -> Vec<Item> {
    let mut out = Vec::new();
    // The open block's info string ("sh", "" for a plain one, …) and, for
    // a plain one, its lines so far.
    let mut open: Option<(String, Vec<String>)> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(info) = t.strip_prefix("```") {
            match open.take() {
                Some((kind, lines)) if kind.is_empty() => out.extend(pasted(lines)),
                Some(_) => {}
                None => open = Some((info.to_string(), Vec::new())),
            }
            continue;
        }
        match &mut open {
            Some((kind, _)) if kind == "sh" => out.extend(as_command(t).map(Item::Run)),
            Some((kind, lines)) if kind.is_empty() => lines.push(line.trim_end().to_string()),
            _ => {}
        }
    }
    out
}

/// A plain block whose first line is `$ COMMAND`, as what COMMAND prints.
fn pasted(mut lines: Vec<String>) -> Option<Item> {
    let first = lines.first()?.strip_prefix("$ ")?.to_string();
    let command = as_command(&first)?;
    lines.remove(0);
    let lines = lines
        .into_iter()
        .filter(|l| !matches!(l.trim(), "…" | "..." | ""))
        .collect();
    Some(Item::Pasted { command, lines })
}

/// The first line of `want` that `printed` lacks, taking them in order.
fn missing<'a>(want: &'a [String], printed: &str) -> Option<&'a str> {
    let mut at = printed.lines().map(str::trim_end);
    want.iter()
        .find(|w| !at.any(|p| same_line(w, p)))
        .map(String::as_str)
}

/// Two lines alike: the same words, and numbers within a thousandth of
/// each other (another CPU's vector width may round the last digit of a
/// loss after 50 steps differently).
fn same_line(want: &str, got: &str) -> bool {
    let (a, x) = numbers_apart(want);
    let (b, y) = numbers_apart(got);
    a == b
        && x.len() == y.len()
        && x.iter()
            .zip(&y)
            .all(|(x, y)| (x - y).abs() <= 1e-3 * x.abs().max(y.abs()).max(1.0))
}

/// A line's text with each number replaced by `#`, and the numbers.
fn numbers_apart(line: &str) -> (String, Vec<f64>) {
    let chars: Vec<char> = line.chars().collect();
    let (mut text, mut numbers, mut i) = (String::new(), Vec::new(), 0);
    while i < chars.len() {
        let starts = chars[i].is_ascii_digit()
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_'));
        if !starts {
            text.push(chars[i]);
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len() && (chars[j].is_ascii_digit() || chars[j] == '.') {
            j += 1;
        }
        // An exponent: `e`, an optional sign, digits.
        let sign = usize::from(chars.get(j + 1).is_some_and(|c| *c == '-' || *c == '+'));
        if chars.get(j) == Some(&'e') && chars.get(j + 1 + sign).is_some_and(char::is_ascii_digit) {
            j += 1 + sign;
            while j < chars.len() && chars[j].is_ascii_digit() {
                j += 1;
            }
        }
        let token: String = chars[i..j].iter().collect();
        match token.trim_end_matches('.').parse::<f64>() {
            Ok(v) => {
                numbers.push(v);
                text.push('#');
                if token.ends_with('.') {
                    text.push('.');
                }
            }
            Err(_) => text.push_str(&token),
        }
        i = j;
    }
    (text, numbers)
}

#[test]
fn pasted_numbers_match_within_a_thousandth_and_words_exactly() {
    let line = "loss 3.1664 -> 2.3246 at step 30, grew 2.491e2x (rms_mlp, D::Minus1, f32)";
    assert!(same_line(line, line));
    assert!(same_line(line, &line.replace("2.3246", "2.3247")));
    assert!(!same_line(line, &line.replace("2.3246", "2.9246")));
    assert!(!same_line(line, &line.replace("step", "steps")));
    assert!(!same_line(line, &line.replace("f32", "f16")));
    assert_eq!(numbers_apart("2.491e2x f32 1.").1, vec![249.1, 1.0]);
}

#[test]
fn every_readme_command_runs_as_written() {
    let items: Vec<Item> = user_pages()
        .iter()
        .flat_map(|(_, text)| readme_commands(text))
        .collect();
    let commands: Vec<String> = items.iter().map(|i| i.command().to_string()).collect();
    assert!(commands.len() >= 20, "{commands:?}");
    assert!(
        commands[0] == "nanhunt fuzz --resume",
        "the main command comes first"
    );
    let dir = scratch("readme-commands");
    std::os::unix::fs::symlink(root().join("corpora"), dir.join("corpora")).unwrap();
    let user_crate = dir.join("my-crate");
    std::fs::create_dir(&user_crate).unwrap();
    // The user's crate holds its sources, as the example's diffs read them.
    std::os::unix::fs::symlink(root().join("harness"), user_crate.join("harness")).unwrap();
    let bin = binary();
    let mut ran = 0;
    let mut compared = 0;
    for item in &items {
        let command = item.command();
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
        if let Item::Pasted { lines, .. } = item {
            let printed = stdout(&out);
            if let Some(line) = missing(lines, &printed) {
                panic!(
                    "`{command}` no longer prints the pasted line\n{line}\nit printed:\n{printed}"
                );
            }
            compared += 1;
        }
        ran += 1;
    }
    assert!(ran >= 20, "ran {ran}");
    assert!(compared >= 2, "compared {compared} pasted outputs");
    // No excuse outlives its command.
    for (fragment, _) in EXCUSED {
        assert!(
            commands.iter().any(|c| c.contains(fragment)),
            "`{fragment}` excuses no README command"
        );
    }
}
