//! The table as Markdown, CSV and JSON.

use super::{LrTable, Row, Spread, Threshold};
use std::fmt::Write;

/// An LR with two significant digits: `1.1e-2`.
pub fn lr(x: f64) -> String {
    format!("{x:.1e}")
}

fn threshold(t: &Threshold) -> String {
    match *t {
        Threshold::Found { unstable, .. } => lr(unstable),
        Threshold::BelowRange { min } => format!("<{}", lr(min)),
        Threshold::AboveRange { max } => format!(">{}", lr(max)),
    }
}

fn spread(s: &Option<Spread>) -> String {
    match s {
        Some(s) if s.min == s.max => threshold(&s.median),
        Some(s) => format!(
            "{} [{}, {}]",
            threshold(&s.median),
            threshold(&s.min),
            threshold(&s.max)
        ),
        None => "–".into(),
    }
}

fn opt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map_or_else(|| "–".into(), f)
}

fn ratio(x: f64) -> String {
    format!("{x:.2}")
}

/// The seeds whose instability is not monotone in the LR, one line each.
fn islands(table: &LrTable) -> String {
    let mut out = String::new();
    for r in &table.rows {
        for s in &r.seeds {
            for (what, isl) in [
                ("diverges", &s.divergence_islands),
                ("NaN/Inf", &s.non_finite_islands),
            ] {
                if isl.is_empty() {
                    continue;
                }
                let stretches: Vec<String> = isl
                    .unstable
                    .iter()
                    .map(|[a, b]| {
                        if a == b {
                            lr(*a)
                        } else {
                            format!("{}–{}", lr(*a), lr(*b))
                        }
                    })
                    .collect();
                let above = match isl.onset {
                    Some(onset) => format!(", unstable from {} on", lr(onset)),
                    None => " up to the highest LR run".into(),
                };
                let _ = writeln!(
                    out,
                    "- {} seed {}: {what} at {}, stable again above it{above}",
                    r.label(),
                    s.seed,
                    stretches.join(", "),
                );
            }
        }
    }
    if out.is_empty() {
        return out;
    }
    format!("Unstable islands, stable again above them (the threshold is the first unstable LR):\n\n{out}\n")
}

fn savings(table: &LrTable) -> String {
    if table.runs == 0 {
        return String::new();
    }
    format!(
        "Training runs: {} by bisection and verification; a grid sweep of the same resolution over the same ranges would take {} ({:.1}× as many).",
        table.runs,
        table.grid_runs,
        table.grid_runs as f64 / table.runs as f64
    )
}

impl LrTable {
    /// The table as Markdown.
    pub fn to_markdown(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        out.push_str("# Learning-rate thresholds\n\n");
        let _ = writeln!(
            out,
            "For each configuration and seed, bisection in log10(LR) to {} decades between {} and {}, \
             then every grid LR within {} decade(s) below the bracket is run and the threshold moves to any unstable one. \
             *Diverges*: {}. *NaN/Inf*: the first non-finite value (or half-precision overflow) in any stage. \
             Thresholds are the first unstable LR on the grid: median [min, max] over {} seeds{}. \
             *Recommended*: {}. *Predicted*: the divergence LR a quadratic model gives for the sharpness at initialization \
             (top Hessian eigenvalue by Lanczos on finite-difference Hessian-vector products; \
             Adam-type optimizers use the Hessian preconditioned by their second-moment estimate); \
             *(not converged)*: the estimate's residual stayed above its tolerance on some seed; \
             *(not smooth)*: on some seed the eigenvalue moved by more than 5% with a ten times finer difference \
             (kinks such as ReLU's are crossed): the prediction is not to be trusted.\n",
            s.tolerance_decades,
            lr(s.min_lr),
            lr(s.max_lr),
            super::VERIFY_DECADES,
            s.divergence,
            s.seeds,
            if s.full_batch { ", full-batch" } else { "" },
            s.recommendation_rule,
        );
        out.push_str("| family | size | optimizer | precision | diverges at | NaN/Inf at | recommended | predicted | measured / predicted | runs (grid) |\n");
        out.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
        for r in &self.rows {
            let cells = match &r.error {
                Some(e) => format!("not runnable: {} | | | | | |", e.replace('|', "\\|")),
                None => format!(
                    "{} | {} | {} | {} | {} | {} ({})",
                    spread(&r.divergence),
                    spread(&r.non_finite),
                    opt(r.recommended_lr, lr),
                    predicted(r),
                    opt(r.measured_over_predicted, ratio),
                    r.runs,
                    r.grid_runs
                ),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {cells} |",
                r.family, r.size, r.optimizer, r.precision
            );
        }
        out.push('\n');
        out.push_str(&islands(self));
        out.push_str(&savings(self));
        out.push('\n');
        out
    }

    /// The table as CSV (one row per configuration).
    pub fn to_csv(&self) -> String {
        let mut out = String::from(
            "family,size,optimizer,precision,divergence_median,divergence_min,divergence_max,\
             nan_median,nan_min,nan_max,recommended_lr,predicted_lr,predicted_converged,predicted_smooth,prediction_rule,\
             measured_over_predicted,runs,grid_runs,error\n",
        );
        let spread_cells = |s: &Option<Spread>| match s {
            Some(s) => [s.median, s.min, s.max]
                .map(|t| threshold_csv(&t))
                .join(","),
            None => ",,".into(),
        };
        for r in &self.rows {
            let num = |x: Option<f64>| x.map_or_else(String::new, |v| format!("{v:e}"));
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                csv_field(&r.family),
                csv_field(&r.size),
                csv_field(&r.optimizer),
                r.precision,
                spread_cells(&r.divergence),
                spread_cells(&r.non_finite),
                num(r.recommended_lr),
                num(r.predicted_lr),
                r.predicted_converged
                    .map_or_else(String::new, |c| c.to_string()),
                r.predicted_smooth
                    .map_or_else(String::new, |c| c.to_string()),
                csv_field(&r.prediction_rule),
                num(r.measured_over_predicted),
                r.runs,
                r.grid_runs,
                csv_field(r.error.as_deref().unwrap_or("")),
            );
        }
        out
    }

    /// The table as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a table always serializes") + "\n"
    }
}

/// The predicted LR, marked when its curvature estimate did not converge.
fn predicted(r: &Row) -> String {
    let cell = opt(r.predicted_lr, lr);
    if r.predicted_lr.is_none() {
        return cell;
    }
    let mut marks = Vec::new();
    if r.predicted_converged == Some(false) {
        marks.push("not converged");
    }
    if r.predicted_smooth == Some(false) {
        marks.push("not smooth");
    }
    match marks.is_empty() {
        true => cell,
        false => format!("{cell} ({})", marks.join(", ")),
    }
}

/// A threshold in CSV: the LR, or `<min` / `>max` outside the range.
fn threshold_csv(t: &Threshold) -> String {
    match *t {
        Threshold::Found { unstable, .. } => format!("{unstable:e}"),
        Threshold::BelowRange { min } => format!("<{min:e}"),
        Threshold::AboveRange { max } => format!(">{max:e}"),
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

impl Row {
    /// The row's configuration as `family/size/optimizer/precision`.
    pub fn label(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.family, self.size, self.optimizer, self.precision
        )
    }
}
