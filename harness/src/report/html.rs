//! A self-contained HTML page (inline CSS, inline SVG plots drawn with
//! plotters; no external assets) with the Markdown report's tables.

use super::{round_sig, StabilityReport};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::fmt::Write;

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

use crate::format::escape_html as escape;

/// A plot's legend, drawn as HTML beside the plot rather than over it.
struct Legend(Vec<(RGBColor, String)>);

impl Legend {
    fn html(&self) -> String {
        let mut s = String::from("<ul class=\"legend\">");
        for (RGBColor(r, g, b), label) in &self.0 {
            let _ = write!(
                s,
                "<li><span class=\"swatch\" style=\"background:#{r:02x}{g:02x}{b:02x}\"></span>{}</li>",
                escape(label)
            );
        }
        s.push_str("</ul>");
        s
    }
}

/// One plot: its SVG and its legend.
struct Plot {
    svg: String,
    legend: Legend,
}

impl Plot {
    fn html(&self) -> String {
        format!("<figure>{}{}</figure>", self.svg, self.legend.html())
    }
}

/// Draws one line with a marker at each point (a lone point is a cross,
/// so a run that stopped after one step is seen).
fn draw_line<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    points: Vec<(f64, f64)>,
    color: RGBColor,
) -> Option<()> {
    if let [p] = points[..] {
        chart
            .draw_series(std::iter::once(Cross::new(p, 6, color.stroke_width(2))))
            .ok()?;
        return Some(());
    }
    chart
        .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
        .ok()?;
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, 2, color.filled())))
        .ok()?;
    Some(())
}

/// Loss curves of a family's representative stable and unstable runs.
fn loss_plot(r: &StabilityReport, family: &str) -> Option<Plot> {
    let curves: Vec<_> = r
        .curves
        .iter()
        .filter(|c| c.family == family && !c.losses.is_empty())
        .collect();
    let finite: Vec<f64> = curves
        .iter()
        .flat_map(|c| c.losses.iter().copied())
        .filter(|v| v.is_finite())
        .collect();
    if finite.is_empty() {
        return None;
    }
    let (lo, hi) = finite
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    let pad = ((hi - lo).abs() * 0.05).max(1e-6);
    let steps = curves
        .iter()
        .map(|c| c.losses.len())
        .max()
        .unwrap_or(1)
        .max(2);
    let mut svg = String::new();
    let mut legend = Vec::new();
    {
        let root = SVGBackend::with_string(&mut svg, (520, 300)).into_drawing_area();
        root.fill(&WHITE).ok()?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("{family}: loss of representative runs"),
                ("sans-serif", 15),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..(steps - 1) as f64, (lo - pad)..(hi + pad))
            .ok()?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("loss")
            .draw()
            .ok()?;
        for c in &curves {
            let color = if c.verdict == crate::finding::Verdict::Stable {
                PALETTE[2]
            } else {
                PALETTE[1]
            };
            let points: Vec<(f64, f64)> = c
                .losses
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(x, &v)| (x as f64, v))
                .collect();
            let note = match points.len() {
                0 => " — no finite loss",
                1 => " — one finite step (×)",
                _ => "",
            };
            let label = match &c.signature {
                Some(s) => format!("run {} ({}): {s}{note}", c.index, c.verdict),
                None => format!("run {} ({}){note}", c.index, c.verdict),
            };
            legend.push((color, label));
            if !points.is_empty() {
                draw_line(&mut chart, points, color)?;
            }
        }
        root.present().ok()?;
    }
    Some(Plot {
        svg,
        legend: Legend(legend),
    })
}

/// Failure rate per decade of learning rate, one bar per family, each
/// labelled with its counts (unstable/runs): a bin of one run is seen as
/// one run, not as a rate of 1.0 joined to its neighbours.
fn lr_plot(r: &StabilityReport) -> Option<Plot> {
    if r.lr_sweep.is_empty() {
        return None;
    }
    let lo = r.lr_sweep.iter().map(|b| b.decade).min()? as f64;
    let hi = r.lr_sweep.iter().map(|b| b.decade).max()? as f64 + 1.0;
    let mut families: Vec<&str> = r.lr_sweep.iter().map(|b| b.family.as_str()).collect();
    families.sort();
    families.dedup();
    let width = 0.8 / families.len() as f64;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (520, 300)).into_drawing_area();
        root.fill(&WHITE).ok()?;
        let mut chart = ChartBuilder::on(&root)
            .caption("failure rate by learning rate", ("sans-serif", 15))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(lo..hi, 0f64..1.15f64)
            .ok()?;
        chart
            .configure_mesh()
            .x_desc("log10(learning rate), decade")
            .y_desc("unstable / runs")
            .draw()
            .ok()?;
        for (i, family) in families.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            for b in r.lr_sweep.iter().filter(|b| b.family == *family) {
                let x0 = b.decade as f64 + 0.1 + i as f64 * width;
                let rate = round_sig(b.unstable as f64 / b.runs.max(1) as f64, 3);
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x0, 0.0), (x0 + width * 0.9, rate)],
                        color.filled(),
                    )))
                    .ok()?;
                chart
                    .draw_series(std::iter::once(Text::new(
                        format!("{}/{}", b.unstable, b.runs),
                        (x0, rate + 0.07),
                        ("sans-serif", 10),
                    )))
                    .ok()?;
            }
        }
        root.present().ok()?;
    }
    let legend = families
        .iter()
        .enumerate()
        .map(|(i, f)| (PALETTE[i % PALETTE.len()], f.to_string()))
        .collect();
    Some(Plot {
        svg,
        legend: Legend(legend),
    })
}

/// The learning-rate bins as a table: the counts behind the bars.
fn lr_table(r: &StabilityReport) -> String {
    let mut s = String::from(
        "<table class=\"bins\"><tr><th>family</th><th>learning rate</th><th>runs</th><th>unstable</th><th>rate</th></tr>",
    );
    for b in &r.lr_sweep {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>[1e{}, 1e{})</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            escape(&b.family),
            b.decade,
            b.decade + 1,
            b.runs,
            b.unstable,
            round_sig(b.unstable as f64 / b.runs.max(1) as f64, 3)
        );
    }
    s.push_str("</table>");
    s
}

pub fn render(r: &StabilityReport) -> String {
    let mut s = String::new();
    let h = &r.header;
    let _ = write!(
        s,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>nanhunt stability report</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em auto; padding: 0 1em; max-width: 1200px; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.85em; width: 100%; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.5em; text-align: left; overflow-wrap: break-word; }}
th {{ background: #f3f3f3; }}
td.num {{ text-align: right; }}
table.bins {{ width: auto; }}
.plots {{ display: flex; flex-wrap: wrap; gap: 1em; }}
figure {{ margin: 0; max-width: 100%; }}
figure svg {{ max-width: 100%; height: auto; }}
ul.legend {{ list-style: none; padding: 0; margin: 0.3em 0; font-size: 0.8em; max-width: 520px; }}
ul.legend li {{ margin: 0.15em 0; overflow-wrap: anywhere; }}
.swatch {{ display: inline-block; width: 1.2em; height: 0.8em; margin-right: 0.4em; vertical-align: middle; }}
code {{ font-size: 0.9em; word-break: break-all; }}
</style></head><body>
<h1>nanhunt stability report</h1>
<p>Campaign seed {}, families {}, device {}, budget {}{}{}; nanhunt {}.</p>
"#,
        h.seed,
        escape(&h.families.join(", ")),
        escape(&h.device),
        escape(&h.budget),
        h.drawn(),
        h.data
            .as_ref()
            .map_or(String::new(), |d| format!(", data {}", escape(d))),
        escape(&h.nanhunt_version)
    );
    let t = &r.totals;
    let _ = writeln!(
        s,
        "<table><tr><th>runs</th><th>stable</th><th>unstable</th><th>errors</th><th>timed out</th><th>signatures</th></tr>\
<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr></table>",
        t.runs, t.stable, t.unstable, t.errors, t.timeouts, r.signatures.len()
    );
    let _ = writeln!(s, "<h2>Plots</h2><div class=\"plots\">");
    for family in &h.families {
        if let Some(plot) = loss_plot(r, family) {
            let _ = writeln!(s, "{}", plot.html());
        }
    }
    if let Some(plot) = lr_plot(r) {
        let _ = writeln!(s, "{}", plot.html());
    }
    let _ = writeln!(s, "</div>");
    if !r.lr_sweep.is_empty() {
        let _ = writeln!(s, "<h3>Runs per learning-rate decade</h3>{}", lr_table(r));
    }

    let _ = writeln!(s, "<h2>Failure signatures</h2><table><tr><th>kind</th><th>phase</th><th>stage</th><th>family</th><th>optimizer</th><th>precision</th><th>device</th><th>runs</th><th>first step</th><th>at higher precision</th><th>what the stage did</th><th>reproducer</th></tr>");
    for row in &r.signatures {
        let g = &row.signature;
        let _ = writeln!(
            s,
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            g.kind.as_str(),
            g.phase.as_str(),
            escape(&g.stage),
            escape(&g.family),
            escape(&g.optimizer),
            escape(g.precision.name()),
            escape(&g.device.to_string()),
            row.count,
            row.first_step,
            row.fidelity.map_or("–", |f| f.as_str()),
            row.pattern.map_or("–", |p| p.as_str()),
            escape(row.reproducer.as_deref().unwrap_or("–"))
        );
    }
    let _ = writeln!(s, "</table>");
    let _ = writeln!(s, "<h2>By configuration</h2><table><tr><th>family</th><th>loss</th><th>optimizer</th><th>precision</th><th>device</th><th>runs</th><th>unstable</th><th>LR seen stable</th><th>LR seen unstable</th></tr>");
    let range = |r: &Option<[f64; 2]>| match r {
        None => "–".to_string(),
        Some([lo, hi]) => format!("{lo:e} – {hi:e}"),
    };
    for g in &r.groups {
        let _ = writeln!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
            escape(&g.family),
            escape(&g.loss),
            escape(&g.optimizer),
            escape(&g.precision),
            escape(&g.device),
            g.totals.runs,
            g.totals.unstable,
            range(&g.lr_stable),
            range(&g.lr_unstable)
        );
    }
    let _ = writeln!(s, "</table>\n</body></html>");
    s
}
