//! What a campaign is asked to do: its options, `--shard I/N` and
//! `--budget` durations.

use super::workers::{WorkerLimits, Workers};
use crate::journal::DEFAULT_MUTATION_RATE;
use crate::progress::Reporter;
use crate::spec::DeviceSpec;
use crate::strategy::StrategyOptions;
use std::path::PathBuf;
use std::time::Duration;

/// The most shards a campaign splits into (run indices stay far from u64's end).
pub const MAX_SHARDS: u64 = 1 << 20;

/// `--shard I/N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This shard's index, from 0.
    pub index: u64,
    /// Shards in all.
    pub count: u64,
}

impl Default for Shard {
    fn default() -> Self {
        Shard { index: 0, count: 1 }
    }
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let err = || {
            format!("`{s}` is not a shard: expected I/N with 0 <= I < N <= {MAX_SHARDS}, e.g. 3/8")
        };
        let (i, n) = s.split_once('/').ok_or_else(err)?;
        let (index, count): (u64, u64) = (
            i.trim().parse().map_err(|_| err())?,
            n.trim().parse().map_err(|_| err())?,
        );
        if count == 0 || index >= count || count > MAX_SHARDS {
            return Err(err());
        }
        Ok(Shard { index, count })
    }
}

/// Parses `90s`, `15m`, `2h`, `1h30m` or a plain number of seconds.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let err = || format!("`{s}` is not a duration: use e.g. 90s, 15m, 2h or 1h30m");
    // At most 100 years: a longer budget is a typo, and `Duration` overflows past u64 seconds.
    let seconds = |secs: f64| {
        (secs.is_finite() && (0.0..=MAX_DURATION_S).contains(&secs))
            .then(|| Duration::from_secs_f64(secs))
            .ok_or_else(|| format!("`{s}` is not a duration between 0 and 100 years: use e.g. 90s, 15m, 2h or 1h30m"))
    };
    if let Ok(secs) = s.parse::<f64>() {
        return seconds(secs);
    }
    let mut total = 0f64;
    let mut number = String::new();
    for ch in s.chars() {
        if ch.is_ascii_digit() || ch == '.' {
            number.push(ch);
        } else {
            let v: f64 = number.parse().map_err(|_| err())?;
            number.clear();
            total += v * match ch {
                's' => 1.0,
                'm' => 60.0,
                'h' => 3600.0,
                'd' => 86400.0,
                _ => return Err(err()),
            };
        }
    }
    if !number.is_empty() || s.is_empty() {
        return Err(err());
    }
    seconds(total)
}

const MAX_DURATION_S: f64 = 100.0 * 365.25 * 86400.0;

/// How a campaign runs. Built from `CampaignOptions::default()`; fields may be added.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CampaignOptions {
    /// How cases are drawn.
    pub strategy: StrategyOptions,
    /// Stop after this long (checked between runs).
    pub budget: Option<Duration>,
    /// Stop after this many runs of this shard (resumed runs count).
    pub runs: Option<u64>,
    /// Worker threads.
    pub jobs: usize,
    /// The campaign seed: a run's case is a function of it and the run's index.
    pub seed: u64,
    /// The device cases train on.
    pub device: DeviceSpec,
    /// On an accelerator, which cases train there ([`Placement`]).
    pub placement: Placement,
    /// The campaign's directory (journal, reproducers, summary).
    pub out: PathBuf,
    /// Continue the campaign journaled in `out` (else `out` must be new or empty).
    pub resume: bool,
    /// This process's shard of the run indices.
    pub shard: Shard,
    /// Training runs each minimization may spend.
    pub minimize_runs: usize,
    /// Where to report the runs done (none: nowhere).
    pub progress: Option<Reporter>,
    /// Threads, or one child process per worker (isolates crashes).
    pub workers: Workers,
    /// Case size limits, the per-run time limit and each child's memory limit.
    pub limits: WorkerLimits,
    /// The share of runs that mutate a case this shard found (0: every run
    /// a fresh draw, a function of seed and index alone, so that shards
    /// merge into exactly the campaign run in one process).
    pub mutation_rate: f64,
}

impl Default for CampaignOptions {
    fn default() -> Self {
        CampaignOptions {
            strategy: StrategyOptions::default(),
            budget: None,
            runs: Some(100),
            jobs: 1,
            seed: 0,
            device: DeviceSpec::Cpu,
            placement: Placement::default(),
            out: PathBuf::from("nanhunt-out"),
            resume: false,
            shard: Shard::default(),
            minimize_runs: 150,
            progress: None,
            workers: Workers::Threads,
            limits: WorkerLimits::default(),
            mutation_rate: DEFAULT_MUTATION_RATE,
        }
    }
}

/// Where a campaign on an accelerator (`--device cuda`) trains its cases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placement {
    /// Each case on the runner's CPU or on the device, wherever cases of
    /// its family and size ran faster, as measured while the campaign
    /// runs: the device gets the models large enough to keep it busy.
    #[default]
    Speed,
    /// Every case on the device (with one job, the same seed finds the
    /// same signatures, which placement by measured speed cannot promise).
    Device,
}

/// The budget in words: `2h 0m 0s`, `100 runs`, or both.
pub fn budget_text(opts: &CampaignOptions) -> String {
    let time = opts.budget.map(|d| {
        let s = d.as_secs();
        format!("{}h {}m {}s", s / 3600, s / 60 % 60, s % 60)
    });
    let runs = opts.runs.map(|n| format!("{n} runs"));
    match (time, runs) {
        (Some(t), Some(r)) => format!("{t} or {r}"),
        (Some(t), None) => t,
        (None, Some(r)) => r,
        (None, None) => "unbounded".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_and_durations_parse() {
        assert_eq!("3/8".parse::<Shard>(), Ok(Shard { index: 3, count: 8 }));
        assert!("8/8".parse::<Shard>().is_err());
        assert!("0/18446744073709551615".parse::<Shard>().is_err());
        assert!("x".parse::<Shard>().is_err());
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("10m5").is_err());
    }
}
