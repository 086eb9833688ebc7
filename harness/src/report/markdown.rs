//! Markdown: for terminals and pull-request comments.

use super::StabilityReport;
use std::fmt::Write;

fn lr_range(r: &Option<[f64; 2]>) -> String {
    match r {
        None => "–".into(),
        Some([lo, hi]) if lo == hi => format!("{lo:e}"),
        Some([lo, hi]) => format!("{lo:e} – {hi:e}"),
    }
}

pub fn render(r: &StabilityReport) -> String {
    let mut s = String::new();
    let h = &r.header;
    let _ = writeln!(s, "# nanhunt stability report\n");
    let _ = writeln!(
        s,
        "Campaign seed {}, families {}, device {}, budget {}{}{}; nanhunt {}.\n",
        h.seed,
        h.families.join(", "),
        h.device,
        h.budget,
        h.drawn(),
        h.data
            .as_ref()
            .map_or(String::new(), |d| format!(", data {d}")),
        h.nanhunt_version
    );
    let t = &r.totals;
    let _ = writeln!(
        s,
        "| runs | stable | unstable | errors | timed out | signatures |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|");
    let _ = writeln!(
        s,
        "| {} | {} | {} | {} | {} | {} |\n",
        t.runs,
        t.stable,
        t.unstable,
        t.errors,
        t.timeouts,
        r.signatures.len()
    );

    let _ = writeln!(s, "## Failure signatures\n");
    if r.signatures.is_empty() {
        let _ = writeln!(s, "None: every run stayed stable.\n");
    } else {
        let _ = writeln!(s, "| kind | phase | stage | family | optimizer | precision | device | runs | first step | at higher precision | what the stage did | reproducer |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---:|---:|---|---|---|");
        for row in &r.signatures {
            let g = &row.signature;
            let _ = writeln!(
                s,
                "| {} | {} | `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                g.kind.as_str(),
                g.phase.as_str(),
                g.stage,
                g.family,
                g.optimizer,
                g.precision,
                g.device,
                row.count,
                row.first_step,
                row.fidelity.map_or("–", |f| f.as_str()),
                row.pattern.map_or("–", |p| p.as_str()),
                row.reproducer
                    .as_deref()
                    .map_or("–".to_string(), |f| format!("`{f}`"))
            );
        }
        let _ = writeln!(s);
    }

    let _ = writeln!(s, "## By configuration\n");
    let _ = writeln!(s, "| family | loss | optimizer | precision | device | runs | unstable | LR seen stable | LR seen unstable | first failure step |");
    let _ = writeln!(s, "|---|---|---|---|---|---:|---:|---|---|---:|");
    for g in &r.groups {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            g.family,
            g.loss,
            g.optimizer,
            g.precision,
            g.device,
            g.totals.runs,
            g.totals.unstable,
            lr_range(&g.lr_stable),
            lr_range(&g.lr_unstable),
            g.first_failure_step
                .map_or("–".to_string(), |v| v.to_string())
        );
    }
    let _ = writeln!(s);

    let _ = writeln!(s, "## Failure rate by learning rate\n");
    let _ = writeln!(s, "| family | LR decade | runs | unstable |");
    let _ = writeln!(s, "|---|---|---:|---:|");
    for b in &r.lr_sweep {
        let _ = writeln!(
            s,
            "| {} | 1e{} | {} | {} |",
            b.family, b.decade, b.runs, b.unstable
        );
    }
    let _ = writeln!(s);

    let _ = writeln!(s, "## Reproducers\n");
    if r.reproducers.is_empty() {
        let _ = writeln!(s, "None.");
    }
    for f in &r.reproducers {
        let _ = writeln!(s, "- `repro/{f}`");
    }
    s
}
