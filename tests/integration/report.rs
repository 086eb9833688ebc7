//! Stability reports: deterministic, snapshotted in `snapshots/`, sensitive
//! to a change in stability, and the HTML page is self-contained.

use crate::support::*;
use candle_nn::VarBuilder;
use nanhunt::campaign::{run_campaign, CampaignOptions};
use nanhunt::campaign::{user_report, UserCampaign};
use nanhunt::models::{Model, ModuleModel};
use nanhunt::report::StabilityReport;
use nanhunt::spec::*;

/// insta settings: snapshots live in the repository's `snapshots/`, with a
/// device suffix when they were not taken on CPU.
fn settings(device: &str) -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(root().join("snapshots"));
    s.set_prepend_module_to_snapshot(false);
    if device != "cpu" {
        s.set_snapshot_suffix(device.replace(':', "_"));
    }
    s
}

/// A fixed-seed, fixed-run campaign over the built-in families.
fn campaign(name: &str) -> StabilityReport {
    let out = scratch(name);
    let mut opts = CampaignOptions::default();
    opts.strategy.max_steps = 12;
    opts.runs = Some(24);
    opts.jobs = 1;
    opts.seed = 11;
    opts.minimize_runs = 30;
    opts.out = out.to_path_buf();
    run_campaign(&opts).unwrap();
    StabilityReport::from_dir(&out).unwrap()
}

#[test]
fn a_fixed_campaign_gives_a_byte_identical_report_and_matches_its_snapshot() {
    let (a, b) = (campaign("report-a"), campaign("report-b"));
    assert_eq!(
        a.to_json(),
        b.to_json(),
        "JSON differs between two identical campaigns"
    );
    assert_eq!(
        a.to_markdown(),
        b.to_markdown(),
        "Markdown differs between two identical campaigns"
    );
    assert_eq!(
        a.to_html(),
        b.to_html(),
        "HTML differs between two identical campaigns"
    );
    settings(&a.header.device).bind(|| {
        insta::assert_snapshot!("campaign_report_md", a.to_markdown());
        insta::assert_snapshot!("campaign_report_json", a.to_json());
    });
}

#[test]
fn the_html_page_is_self_contained() {
    let report = campaign("report-html");
    let html = report.to_html();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(
        html.matches("<svg").count() >= 2,
        "loss curves and the LR plot are inline SVG"
    );
    for external in ["<script", "<link", "<img", "url(", "src=", "href="] {
        assert!(
            !html.contains(external),
            "`{external}` would load something from outside the page"
        );
    }
    // The only URL is the SVG namespace, which loads nothing.
    let urls = html.matches("http").count();
    assert_eq!(urls, html.matches("http://www.w3.org/2000/svg").count());
    // Legends beside the plots, never over their curves; every
    // learning-rate bar carries its counts, and a table lists them.
    for svg in html.split("<svg").skip(1) {
        let svg = &svg[..svg.find("</svg>").unwrap()];
        assert!(
            !svg.contains("(stable)") && !svg.contains("(unstable)"),
            "a legend inside a plot"
        );
    }
    assert!(html.matches("<ul class=\"legend\">").count() >= 2);
    let lr_svg = html
        .split("<svg")
        .find(|s| s.contains("failure rate by learning rate"))
        .unwrap();
    let counts = lr_svg
        .split("<text")
        .skip(1)
        .filter(|t| {
            let label = t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()].trim();
            label
                .split_once('/')
                .is_some_and(|(u, n)| u.parse::<u64>().is_ok() && n.parse::<u64>().is_ok())
        })
        .count();
    assert_eq!(
        counts,
        report.lr_sweep.len(),
        "one unstable/runs label per bar"
    );
    assert!(html.contains("Runs per learning-rate decade"));
}

fn user_case(loss: LossSpec) -> Case {
    let mut c = Case::example("cnn").unwrap();
    c.model = ModelSpec::Custom(CustomSpec::new(
        "user_mlp",
        InputSpec::Vector { features: 8 },
        4,
    ));
    c.steps = 30;
    c.loss = loss;
    // The article's log(1 - p) loss is unbounded below: a large step size
    // drives p to 1 quickly, and only its eps keeps log(1 - p) finite.
    c.optimizer.set_lr(0.3);
    c
}

fn user_factory(vb: VarBuilder) -> candle_core::Result<Box<dyn Model>> {
    let l1 = candle_nn::linear(8, 16, vb.pp("l1"))?;
    let l2 = candle_nn::linear(16, 4, vb.pp("l2"))?;
    Ok(Box::new(ModuleModel(
        candle_nn::seq()
            .add(l1)
            .add(candle_nn::Activation::Relu)
            .add(l2),
    )))
}

/// What a user's suite does: a seeded campaign around their own model,
/// snapshotted. Changing one knob (the loss's eps) changes stability, and
/// with it the snapshot.
#[test]
fn a_users_model_report_snapshots_and_changes_with_stability() {
    let campaign = UserCampaign::new(12, 3);
    let unguarded = user_report(
        &user_case(LossSpec::LogOneMinus { eps: 0.0 }),
        &user_factory,
        &campaign,
    )
    .unwrap();
    let guarded = user_report(
        &user_case(LossSpec::LogOneMinus { eps: 1e-3 }),
        &user_factory,
        &campaign,
    )
    .unwrap();
    settings("cpu")
        .bind(|| insta::assert_snapshot!("user_model_report_md", unguarded.to_markdown()));
    assert!(
        unguarded.totals.unstable > guarded.totals.unstable,
        "{:?} vs {:?}",
        unguarded.totals,
        guarded.totals
    );
    assert_ne!(
        unguarded.to_markdown(),
        guarded.to_markdown(),
        "a change in stability must show in the snapshot"
    );
}

/// Every file in snapshots/ belongs to a snapshot assertion in this suite
/// (what `cargo insta test --unreferenced=reject` checks): a renamed or
/// deleted assertion cannot leave its old snapshot behind.
#[test]
fn every_snapshot_file_is_referenced_by_an_assertion() {
    let mut names = std::collections::BTreeSet::new();
    let mut dirs = vec![root().join("tests/integration")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(path).unwrap();
            for part in text.split("assert_snapshot!(\"").skip(1) {
                names.insert(part.split('"').next().unwrap().to_string());
            }
        }
    }
    assert!(names.len() >= 4, "{names:?}");
    for entry in std::fs::read_dir(root().join("snapshots")).unwrap() {
        let file = entry.unwrap().file_name().to_string_lossy().into_owned();
        let name = file
            .strip_suffix(".snap")
            .unwrap_or_else(|| panic!("snapshots/{file}: not a snapshot (a pending .snap.new?)"));
        // A per-device suffix: name@suffix.snap.
        let name = name.split('@').next().unwrap();
        assert!(
            names.contains(name),
            "snapshots/{file} is referenced by no assertion"
        );
    }
}
