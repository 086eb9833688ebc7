//! The risk report of a hunt: each risky stage of a model with its margin
//! in training and what the hunt found — fired on the data, triggered by a
//! perturbation of k× the data's scale (with its reproducer), or nothing
//! within the bound — as Markdown, JSON and a self-contained HTML page.
//! Numbers are rounded and stages sorted, so the same hunt gives the same
//! bytes (snapshot them).

use crate::finding::{OpKind, OpSite};
use serde::Serialize;
use std::collections::BTreeMap;

/// What a hunt found in one model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RiskReport {
    /// The model (its family, or the user's model's name).
    pub model: String,
    /// The data it trained on, in words.
    pub dataset: String,
    /// Training steps run before the search (where the data fired, the
    /// step it fired at: the steps before it trained).
    pub steps: usize,
    /// The data's scale: the largest magnitude in the searched batch;
    /// perturbations are multiples of it.
    pub scale: f64,
    /// The largest perturbation searched, as a multiple of the scale.
    pub bound: f64,
    /// Token inputs: the most tokens swapped per row.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_swaps: Option<usize>,
    /// Each risky stage or op, and what the hunt found there.
    pub stages: Vec<StageRisk>,
    /// The recorded ops without an unsafe domain in the dtype they compute
    /// in (not searched, none can fire by itself), counted by kind.
    pub unsafe_free: BTreeMap<String, usize>,
    /// Forward and backward passes the search spent (its cost).
    pub evaluations: usize,
}

/// One risky stage.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageRisk {
    /// The stage or op.
    pub stage: String,
    /// What it computes.
    pub op: OpKind,
    /// The op was read from the stage's name (the model did not declare it).
    pub op_from_name: bool,
    /// The rule of its kind (`rules`): its name, and its unsafe
    /// domain in words.
    pub risk: String,
    /// Its unsafe domain, in words.
    pub domain: String,
    /// Where the op is, in an instrumented function.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<OpSite>,
    /// The least margin seen in training, in decades (0: it reached its
    /// unsafe domain); `None` when it could not be read.
    pub margin: Option<f64>,
    /// What the hunt found.
    #[serde(flatten)]
    pub status: RiskStatus,
}

/// What the hunt found at a stage.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RiskStatus {
    /// Training on the data itself failed at the stage.
    FiredOnData {
        /// The step it failed at.
        step: usize,
        /// The finding's signature.
        signature: String,
    },
    /// A trigger the search found.
    Triggered(Box<Trigger>),
    /// Nothing within the bound made it fire.
    NoTrigger {
        /// The largest perturbation searched.
        bound: f64,
    },
    /// Token inputs: nothing within `swaps` swapped tokens per row made
    /// it fire.
    NoTokenTrigger {
        /// The most tokens swapped per row.
        swaps: usize,
    },
    /// The stage could not be searched (and why).
    NotSearched {
        /// Why not.
        why: String,
    },
    /// Searched: its candidates fired another op first (credited there),
    /// and none of its own within the bound.
    FiredElsewhere {
        /// The op that fired first.
        first: String,
    },
}

/// How a trigger was found, and what replays it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Trigger {
    /// How it was found.
    #[serde(flatten)]
    pub by: TriggerKind,
    /// The finding the trigger gives (its signature, as a slug).
    pub signature: String,
    /// The finding's explanation, where it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explanation: Option<String>,
    /// The reproducer: a scene directory (relative to the hunt's output),
    /// which `nanhunt replay` and `regression::assert_dir_reproduces` replay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reproducer: Option<String>,
    /// Why there is no reproducer although the search confirmed the
    /// trigger: its step did not fail again from the same state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreproducible: Option<String>,
}

/// How a trigger was found.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "by", rename_all = "snake_case")]
#[non_exhaustive]
pub enum TriggerKind {
    /// Inputs within `perturbation` × the data's scale of the training
    /// batch (an L∞ distance), `rows` of them after minimization.
    Input {
        /// The L∞ distance, in multiples of the data's scale.
        perturbation: f64,
        /// Rows after minimization.
        rows: usize,
    },
    /// Token inputs: `swapped` tokens of the training batch swapped for
    /// others (guided by the gradient through the embedding), in `rows`
    /// rows after minimization.
    Tokens {
        /// Tokens swapped.
        swapped: usize,
        /// Rows after minimization.
        rows: usize,
    },
    /// A few steps at `lr_factor` × the learning rate drift the weights
    /// until the training data fires it.
    WeightDrift {
        /// The learning-rate factor.
        lr_factor: f64,
        /// Steps of drift.
        steps: usize,
    },
}

/// Three significant digits, for stable reports.
fn round3(x: f64) -> f64 {
    crate::format::round_sig(x, 3)
}

impl RiskReport {
    /// The report with its numbers rounded (what is rendered and snapshotted).
    pub fn rounded(mut self) -> RiskReport {
        self.scale = round3(self.scale);
        for s in &mut self.stages {
            s.margin = s.margin.map(|m| (m * 100.0).round() / 100.0);
            if let RiskStatus::Triggered(t) = &mut s.status {
                if let TriggerKind::Input { perturbation, .. } = &mut t.by {
                    *perturbation = round3(*perturbation);
                }
            }
        }
        self
    }

    /// Whether the hunt found a stage that fires (on the data or triggered).
    pub fn found(&self) -> bool {
        self.stages.iter().any(|s| {
            matches!(
                s.status,
                RiskStatus::FiredOnData { .. } | RiskStatus::Triggered(_)
            )
        })
    }

    /// The report as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a risk report serializes") + "\n"
    }

    /// One line per stage: what the hunt found there.
    fn rows(&self) -> Vec<[String; 6]> {
        self.stages
            .iter()
            .map(|s| {
                let op = if s.op_from_name {
                    format!("{} (by name)", s.op)
                } else {
                    s.op.to_string()
                };
                let margin = s
                    .margin
                    .map_or_else(|| "-".to_string(), |m| format!("{m:.2}"));
                let (status, replay) = match &s.status {
                    RiskStatus::FiredOnData { step, .. } => {
                        (format!("fired on the data at step {step}"), String::new())
                    }
                    RiskStatus::Triggered(t) => {
                        let how = match &t.by {
                            TriggerKind::Input { perturbation, rows } => format!(
                                "triggered at a perturbation of {perturbation}x the data's scale ({rows} {})",
                                if *rows == 1 { "row" } else { "rows" }
                            ),
                            TriggerKind::Tokens { swapped, rows } => format!(
                                "triggered by swapping {swapped} {} of the batch ({rows} {})",
                                if *swapped == 1 { "token" } else { "tokens" },
                                if *rows == 1 { "row" } else { "rows" }
                            ),
                            TriggerKind::WeightDrift { lr_factor, steps } => format!(
                                "triggered by {steps} steps at {lr_factor}x the learning rate"
                            ),
                        };
                        let replay = match (&t.reproducer, &t.unreproducible) {
                            (Some(r), _) => r.clone(),
                            (None, Some(why)) => format!("none: {why}"),
                            (None, None) => String::new(),
                        };
                        (how, replay)
                    }
                    RiskStatus::NoTrigger { bound } => {
                        (format!("no trigger within {bound}x the data's scale"), String::new())
                    }
                    RiskStatus::NoTokenTrigger { swaps } => (
                        format!("no trigger within {swaps} swapped tokens per row"),
                        String::new(),
                    ),
                    RiskStatus::NotSearched { why } => (format!("not searched: {why}"), String::new()),
                    RiskStatus::FiredElsewhere { first } => (
                        format!("searched: its candidates fired `{first}` first"),
                        String::new(),
                    ),
                };
                let at = match &s.site {
                    Some(site) => format!(" (`{}`, {}:{})", site.short_text(40), site.file, site.line),
                    None => String::new(),
                };
                [s.stage.clone(), at, format!("{op}: {}", s.domain), margin, status, replay]
            })
            .collect()
    }

    /// What was searched, in words.
    fn searched(&self) -> String {
        match self.token_swaps {
            Some(swaps) => format!("up to {swaps} swapped tokens per row"),
            None => format!(
                "perturbations in multiples of the data's scale {}, up to {}x",
                self.scale, self.bound
            ),
        }
    }

    /// The training before the search, in words: its steps, or the step
    /// at which the data fired (the search then starts before it).
    fn training(&self) -> String {
        let fired = self.stages.iter().find_map(|s| match s.status {
            RiskStatus::FiredOnData { step, .. } => Some(step),
            _ => None,
        });
        match fired {
            Some(step) => format!(
                "training fired on the data at step {step}, searched from the state before it"
            ),
            None => format!("{} training steps", self.steps),
        }
    }

    /// The report as Markdown.
    pub fn to_markdown(&self) -> String {
        let mut out = format!(
            "# Risk report: {}\n\nData: {}; {}; {}; {} evaluations.\n\n",
            self.model,
            self.dataset,
            self.training(),
            self.searched(),
            self.evaluations
        );
        if self.stages.is_empty() {
            out.push_str("No recorded stage or op has an unsafe domain: nothing was searched. Instrument the model's functions (`#[nanhunt::instrument]`) or record its stages with their kinds (`trace_as`) to hunt in it.\n");
        } else {
            out.push_str(
                "| stage | op: risk | margin in training (decades) | found | reproducer |\n",
            );
            out.push_str("|---|---|---:|---|---|\n");
        }
        for r in self.rows() {
            out.push_str(&format!(
                "| `{}`{} | {} | {} | {} | {} |\n",
                r[0], r[1], r[2], r[3], r[4], r[5]
            ));
        }
        if let Some(free) = self.unsafe_free_line() {
            out.push_str(&format!("\n{free}\n"));
        }
        for s in &self.stages {
            if let RiskStatus::Triggered(t) = &s.status {
                if let Some(e) = &t.explanation {
                    out.push_str(&format!("\n- `{}`: {e}\n", s.stage));
                }
            }
        }
        out
    }

    /// The ops without an unsafe domain, in one sentence.
    fn unsafe_free_line(&self) -> Option<String> {
        if self.unsafe_free.is_empty() {
            return None;
        }
        let total: usize = self.unsafe_free.values().sum();
        let kinds: Vec<String> = self
            .unsafe_free
            .iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect();
        Some(format!(
            "Not searched: {total} recorded {} with no unsafe domain in the dtype they compute in ({}).",
            if total == 1 { "op" } else { "ops" },
            kinds.join(", ")
        ))
    }

    /// The report as a self-contained HTML page.
    pub fn to_html(&self) -> String {
        let esc = crate::format::escape_html;
        let mut rows = String::new();
        for r in self.rows() {
            rows.push_str(&format!("<tr><td>{}{}</td>", esc(&r[0]), esc(&r[1])));
            for cell in &r[2..] {
                rows.push_str(&format!("<td>{}</td>", esc(cell)));
            }
            rows.push_str("</tr>\n");
        }
        format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Risk report: {model}</title>\n<style>body{{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em}}table{{border-collapse:collapse;width:100%;table-layout:auto}}td,th{{border:1px solid #ccc;padding:4px 6px;text-align:left;word-break:break-word}}</style></head>\n<body><h1>Risk report: {model}</h1>\n<p>Data: {data}; {training}; {searched}; {evals} evaluations.</p>\n<table><tr><th>stage</th><th>op: risk</th><th>margin in training (decades)</th><th>found</th><th>reproducer</th></tr>\n{rows}</table>\n<p>{free}</p></body></html>\n",
            model = esc(&self.model),
            data = esc(&self.dataset),
            training = esc(&self.training()),
            searched = esc(&self.searched()),
            evals = self.evaluations,
            free = esc(&self.unsafe_free_line().unwrap_or_else(|| {
                if self.stages.is_empty() {
                    "No recorded stage or op has an unsafe domain: nothing was searched.".into()
                } else {
                    String::new()
                }
            })),
        )
    }
}
