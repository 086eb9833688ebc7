//! `lr-table`'s thresholds against a dense grid: for every family ×
//! optimizer × seed (small size), every grid LR of the table's own grid is
//! trained, and the first unstable one (divergence, and NaN/Inf) is
//! compared with the table's threshold. Prints one line per seed and the
//! totals: thresholds equal to the first unstable grid LR, and the runs the
//! search spent against the grid's.
//!
//! Run: `bash bench/lr_table_vs_grid.sh` (minutes; not part of CI).
//! Arguments: `[seeds] [min_lr] [max_lr]` (defaults 1, 1e-4, 1e3).

use nanhunt::lrtable::{measure_seed, probe_at, Config, LrTableOptions, Threshold, OPTIMIZERS};
use nanhunt::models::BuiltinFactory;
use nanhunt::spec::{Precision, Size};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: f64| args.get(i).map_or(Ok(default), |a| a.parse::<f64>());
    let seeds = arg(0, 1.0)? as usize;
    let mut opts = LrTableOptions::default();
    opts.seeds = seeds;
    opts.min_lr = arg(1, 1e-4)?;
    opts.max_lr = arg(2, 1e3)?;
    opts.start = (1e-3, 1e-1);
    opts.curvature = false;
    opts.validate()?;
    let (grid, range) = (opts.grid(), opts.range());
    let families: Vec<String> = ["cnn", "transformer", "rnn"].map(String::from).to_vec();
    let optimizers: Vec<String> = OPTIMIZERS.iter().map(|s| s.to_string()).collect();
    let configs = Config::builtin(&families, &[Size::Small], &optimizers, &[Precision::F32])?;
    let points = (range.ceil - range.floor + 1) as usize;
    println!(
        "grid: {points} LRs from {:.1e} to {:.1e} ({} decades apart), {seeds} seed(s)",
        opts.min_lr, opts.max_lr, opts.tolerance
    );
    let (mut thresholds, mut equal, mut runs, mut grid_runs, mut islands) = (0, 0, 0, 0, 0);
    // Seeds whose dense grid is not monotone, and how many of them got islands.
    let (mut non_monotone, mut non_monotone_reported) = (0, 0);
    for config in &configs {
        let factory = BuiltinFactory::new(&config.case.model).expect("a built-in family");
        for seed in 0..seeds {
            let table = measure_seed(&config.case, seed, &factory, &opts)?;
            let case = opts.seed_case(&config.case, seed);
            let dense: Vec<_> = (range.floor..=range.ceil)
                .map(|i| probe_at(&case, grid.lr(i), &factory, &opts.run).map(|p| (i, p)))
                .collect::<Result<_, _>>()?;
            let first = |unstable: fn(&nanhunt::lrtable::Probe) -> bool| {
                dense.iter().find(|(_, p)| unstable(p)).map(|&(i, _)| i)
            };
            let mut line = format!("{} seed {seed}:", config_label(config));
            for (what, found, truth) in [
                ("diverges", table.divergence, first(|p| p.diverged)),
                ("NaN/Inf", table.non_finite, first(|p| p.non_finite)),
            ] {
                let same = match (found, truth) {
                    (Threshold::Found { unstable, .. }, Some(t)) => grid.index(unstable) == t,
                    (Threshold::BelowRange { .. }, Some(t)) => t == range.floor,
                    (Threshold::AboveRange { .. }, None) => true,
                    _ => false,
                };
                thresholds += 1;
                equal += usize::from(same);
                let truth = truth.map_or(">max".into(), |t| format!("{:.2e}", grid.lr(t)));
                line += &format!(
                    " {what} {} (grid {truth}){}",
                    threshold(&found),
                    if same { "" } else { " MISMATCH" }
                );
            }
            let reported =
                !table.divergence_islands.is_empty() || !table.non_finite_islands.is_empty();
            islands += usize::from(reported);
            // Unstable at some grid LR and stable again at a higher one.
            let bends = |unstable: fn(&nanhunt::lrtable::Probe) -> bool| {
                dense
                    .iter()
                    .skip_while(|(_, p)| !unstable(p))
                    .any(|(_, p)| !unstable(p))
            };
            if bends(|p| p.diverged) || bends(|p| p.non_finite) {
                non_monotone += 1;
                non_monotone_reported += usize::from(reported);
                line += if reported {
                    " (not monotone: islands reported)"
                } else {
                    " (not monotone: no island among the runs made)"
                };
            }
            runs += table.runs;
            grid_runs += points;
            println!("{line}; {} runs", table.runs);
        }
    }
    println!(
        "thresholds equal to the first unstable grid LR: {equal} of {thresholds}; \
         seeds with islands reported: {islands}; non-monotone grids: {non_monotone}, with islands reported: {non_monotone_reported}; runs: {runs} against the grid's {grid_runs} ({:.2} of it)",
        runs as f64 / grid_runs as f64
    );
    Ok(())
}

fn config_label(c: &Config) -> String {
    format!("{}/{}/{}", c.family, c.size, c.optimizer)
}

fn threshold(t: &Threshold) -> String {
    match *t {
        Threshold::Found { unstable, .. } => format!("{unstable:.2e}"),
        Threshold::BelowRange { min } => format!("<{min:.1e}"),
        Threshold::AboveRange { max } => format!(">{max:.1e}"),
    }
}
