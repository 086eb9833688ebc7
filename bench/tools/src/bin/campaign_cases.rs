//! Writes the cases a fresh campaign draws (no mutations), one JSON file a
//! run, so that each can be run again on its own (`nanhunt run --dump`):
//! `cargo run -p nanhunt-bench-tools --bin campaign_cases -- OUT_DIR RUNS [SEED]`.
//! `scripts/pytorch-findings.py` dumps the scenes of those that fail and
//! re-runs each failing step in PyTorch.

use nanhunt::campaign::{drawn_case, CampaignOptions};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: campaign_cases OUT_DIR RUNS [SEED]";
    let out = std::path::PathBuf::from(args.first().ok_or_else(|| anyhow::anyhow!(usage))?);
    let runs: u64 = args.get(1).ok_or_else(|| anyhow::anyhow!(usage))?.parse()?;
    let seed: u64 = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(0);
    std::fs::create_dir_all(&out)?;
    let mut opts = CampaignOptions::default();
    opts.seed = seed;
    for index in 1..=runs {
        let case = drawn_case(&opts, index);
        let path = out.join(format!("run-{index:04}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(&case)?)?;
    }
    println!("{runs} cases in {}", out.display());
    Ok(())
}
