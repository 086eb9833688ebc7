//! Fuzz campaigns: generate cases (and mutate around what was found), run
//! them on parallel workers, dedup failures by signature, minimize every new
//! signature into a reproducer, and journal everything so that a killed
//! campaign resumes without losing a finding or writing a duplicate.
//!
//! Run indices are global: shard `i` of `n` runs indices `i, i+n, i+2n, …`,
//! and the case of an index is a function of (campaign seed, index) and of
//! the findings known when it was dispatched (mutation picks from them). With
//! one job the whole campaign is deterministic.

use crate::error::{Document, Error, Result};
use crate::journal::{Entry, Journal, Unminimized, MINIMIZE_ATTEMPTS};
use crate::minimize::{minimize, MinimizeOptions};
use crate::outcome::{Signature, Verdict};
use crate::rng::Rng;
use crate::runner::RunOptions;
use crate::spec::*;
use crate::strategy::{generate, StrategyOptions};
use crate::workers::{Executor, ReproduceJob, WorkerLimits, Workers};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const REPRO_DIR: &str = "repro";
pub const SUMMARY_FILE: &str = "summary.json";
/// The share of runs that mutate a found case instead of generating a new one.
const MUTATION_RATE: f64 = 0.25;

/// The most shards a campaign splits into (run indices stay far from u64's end).
pub const MAX_SHARDS: u64 = 1 << 20;

/// `--shard I/N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: u64,
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

#[derive(Clone, Debug)]
pub struct CampaignOptions {
    pub strategy: StrategyOptions,
    /// Stop after this long (checked between runs).
    pub budget: Option<Duration>,
    /// Stop after this many runs of this shard (resumed runs count).
    pub runs: Option<u64>,
    pub jobs: usize,
    pub seed: u64,
    pub device: DeviceSpec,
    pub out: PathBuf,
    /// Continue the campaign journaled in `out` (else `out` must be new or empty).
    pub resume: bool,
    pub shard: Shard,
    /// Training runs each minimization may spend.
    pub minimize_runs: usize,
    /// Draw a progress bar on stderr (when it is a terminal).
    pub progress: bool,
    /// Threads, or one child process per worker (isolates crashes).
    pub workers: Workers,
    /// Case size limits, the per-run time limit and each child's memory limit.
    pub limits: WorkerLimits,
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
            out: PathBuf::from("nanhunt-out"),
            resume: false,
            shard: Shard::default(),
            minimize_runs: 150,
            progress: false,
            workers: Workers::Threads,
            limits: WorkerLimits::default(),
        }
    }
}

/// One distinct signature of a campaign.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SignatureSummary {
    pub slug: String,
    pub signature: Signature,
    pub count: u64,
    pub first_index: u64,
    /// The reproducer file under `repro/`, once minimized.
    pub reproducer: Option<String>,
    /// Why there is no reproducer, when its minimization gave up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unminimized: Option<String>,
}

/// `summary.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub seed: u64,
    pub families: Vec<String>,
    pub shard: (u64, u64),
    pub runs: u64,
    pub runs_this_session: u64,
    pub stable: u64,
    pub unstable: u64,
    pub rejected: u64,
    pub errors: u64,
    pub signatures: Vec<SignatureSummary>,
    /// Signatures that no earlier session reported: found in this session,
    /// or in one that was killed before it ended (the exit code is 1 when any).
    pub new_signatures: Vec<String>,
    pub elapsed_s: f64,
    pub runs_per_s: f64,
}

/// Shared state of the workers.
struct State {
    journal: Journal,
    done: BTreeSet<u64>,
    /// Cases of the known signatures, by slug (sorted: mutation picks deterministically).
    found: BTreeMap<String, Case>,
    entries: Vec<Entry>,
    /// Unstable runs of this session (for the progress line).
    unstable: u64,
}

impl State {
    fn append(&mut self, entries: Vec<Entry>) -> Result<()> {
        self.journal.append_group(&entries)?;
        self.entries.extend(entries);
        Ok(())
    }
}

/// A fresh generated case, or a mutation of a found one.
fn case_for(index: u64, opts: &CampaignOptions, found: &BTreeMap<String, Case>) -> Case {
    let limits = &opts.limits.case;
    let mut rng = Rng::keyed(opts.seed, "campaign.dispatch", index);
    let mut case = if !found.is_empty() && rng.uniform() < MUTATION_RATE {
        let base = found
            .values()
            .nth(rng.below(found.len()))
            .expect("non-empty")
            .clone();
        mutate(&base, &mut rng)
    } else {
        let seed = Rng::keyed(opts.seed, "campaign.generate", index).next_u64();
        generate(&opts.strategy, seed)
    };
    case.device = opts.device;
    if case.validate(limits).is_err() {
        // A mutation can leave the valid space; fall back to a fresh draw.
        case = generate(&opts.strategy, rng.next_u64());
        case.device = opts.device;
    }
    case
}

/// A random nudge of one knob (the neighbourhood of a finding).
pub fn mutate(base: &Case, rng: &mut Rng) -> Case {
    let mut c = base.clone();
    match rng.below(7) {
        0 => {
            let lr = c.optimizer.lr() * 10f64.powf(rng.uniform_in(-1.0, 1.0));
            c.optimizer.set_lr(lr);
        }
        1 => c.seed = rng.next_u64() % 1000,
        2 => {
            c.precision = match rng.below(4) {
                0 => Precision::F32,
                1 => Precision::F16,
                2 => Precision::Bf16,
                _ => Precision::Mixed {
                    compute: HalfType::F16,
                    loss_scaling: LossScaling::default(),
                },
            }
        }
        3 => c.steps = (c.steps * 2).min(60),
        4 => c.data.scale *= 10f64.powf(rng.uniform_in(-1.0, 1.0)),
        5 => c.clip = ClipSpec::None,
        _ => c.batch_size = 1 + rng.below(16),
    }
    c
}

/// The reproducer file name: `<signature-slug>-<short hash of the case>.json`.
pub fn reproducer_name(signature: &Signature, case: &Case) -> String {
    format!(
        "{}-{}.json",
        signature.slug(),
        &format!("{:016x}", crate::rng::fnv1a(case.to_json().as_bytes()))[..8]
    )
}

/// Minimizes a finding and writes its reproducer; returns the journal
/// entry: the reproducer, or `unminimized` when the finding does not come
/// back from a fresh start.
pub(crate) fn reproduce(job: &ReproduceJob) -> Result<Entry> {
    let m = minimize(
        &job.case,
        None,
        &MinimizeOptions {
            max_runs: job.minimize_runs,
            run: RunOptions {
                limits: job.limits.clone(),
                ..RunOptions::default()
            },
            deadline: job.time_limit.map(|t| Instant::now() + t),
        },
    );
    let not_reproducible = |message: String| Entry::Unminimized {
        signature: job.signature.clone(),
        reason: Unminimized::NotReproducible,
        message,
    };
    let m = match m {
        Err(Error::Rejected(reason)) => return Ok(not_reproducible(reason)),
        m => m?,
    };
    let Some(m) = m.filter(|m| m.signature == job.signature) else {
        return Ok(not_reproducible(
            "the finding did not come back when its case ran from the start".into(),
        ));
    };
    let provenance = format!("campaign seed {} run {}", job.campaign_seed, job.index);
    let repro = m.reproducer(&job.case, provenance);
    let file = reproducer_name(&m.signature, &m.case);
    crate::files::write_atomic(
        &job.out.join(REPRO_DIR).join(&file),
        repro.to_json().as_bytes(),
    )?;
    Ok(Entry::Reproducer {
        signature: m.signature,
        file,
        runs_used: m.runs,
        before: m.before,
        after: m.after,
    })
}

/// Minimizes a finding until it has a reproducer or a settled reason for
/// none, journaling each attempt; a worker that dies is replaced and the
/// minimization tried again, up to [`MINIMIZE_ATTEMPTS`] in all.
fn settle_finding(
    executor: &mut Executor,
    state: &Mutex<State>,
    job: &ReproduceJob,
    mut attempts: usize,
) -> Result<()> {
    while attempts < MINIMIZE_ATTEMPTS {
        let entry = executor.reproduce(job)?;
        attempts += 1;
        let retry = match &entry {
            Entry::Unminimized {
                reason, message, ..
            } => {
                eprintln!(
                    "warning: no reproducer for {} (attempt {attempts} of {MINIMIZE_ATTEMPTS}): {message}",
                    job.signature
                );
                reason.retryable()
            }
            _ => false,
        };
        state
            .lock()
            .expect("campaign state poisoned")
            .append(vec![entry])?;
        if !retry {
            break;
        }
    }
    Ok(())
}

fn reproduce_job(
    case: &Case,
    signature: &Signature,
    opts: &CampaignOptions,
    index: u64,
    started: Instant,
) -> ReproduceJob {
    ReproduceJob {
        index,
        case: case.clone(),
        signature: signature.clone(),
        out: opts.out.clone(),
        minimize_runs: opts.minimize_runs,
        campaign_seed: opts.seed,
        limits: opts.limits.case.clone(),
        time_limit: opts.budget.map(|b| b.saturating_sub(started.elapsed())),
    }
}

/// Runs a campaign to its budget; see the module docs.
pub fn run_campaign(opts: &CampaignOptions) -> Result<Summary> {
    let out = &opts.out;
    let has_journal = out.join(crate::journal::JOURNAL_FILE).exists();
    if has_journal && !opts.resume {
        return Err(Error::io(
            out,
            std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "holds a campaign journal: resume it, or choose another output directory",
            ),
        ));
    }
    crate::device::open(opts.device)?;
    // Locks the journal: from here on no other process writes in `out`.
    let (mut journal, mut entries) = Journal::open(out)?;
    let journal_path = out.join(crate::journal::JOURNAL_FILE);
    for dir in [out.clone(), out.join(REPRO_DIR)] {
        crate::files::remove_stale_temps(&dir, None);
    }
    let header = Entry::Start {
        nanhunt_version: env!("CARGO_PKG_VERSION").to_string(),
        seed: opts.seed,
        families: opts.strategy.families.clone(),
        clean_data: opts.strategy.clean_data,
        shard: (opts.shard.index, opts.shard.count),
        device: opts.device.to_string(),
        budget: budget_text(opts),
    };
    match entries.first() {
        None => {
            journal.append(&header)?;
            entries.push(header);
        }
        Some(Entry::Start {
            seed,
            families,
            clean_data,
            shard,
            ..
        }) if *seed == opts.seed
            && families == &opts.strategy.families
            && *clean_data == opts.strategy.clean_data
            && *shard == (opts.shard.index, opts.shard.count) => {}
        Some(_) => {
            return Err(Error::option(
                "resume",
                format!(
                "{} was written by a campaign with another seed, family list, data mode or shard",
                journal_path.display()
            ),
            ))
        }
    }

    let mut done = BTreeSet::new();
    let mut found = BTreeMap::new();
    // Per signature: minimization attempts so far, and whether it is settled.
    let mut attempts: BTreeMap<String, usize> = BTreeMap::new();
    let mut settled = BTreeSet::new();
    let mut pending: Vec<(u64, Signature, Case)> = Vec::new();
    for e in &entries {
        match e {
            Entry::Run { index, .. } => {
                done.insert(*index);
            }
            Entry::Finding {
                index,
                signature,
                case,
            } => {
                if let Err(e) = case.validate(&Limits::default()) {
                    return Err(Error::malformed(
                        Document::Journal,
                        &journal_path,
                        format!(
                            "the finding of run {index} ({signature}) holds an invalid case: {e}"
                        ),
                    ));
                }
                found.insert(signature.slug(), (**case).clone());
                pending.push((*index, signature.clone(), (**case).clone()));
            }
            Entry::Reproducer { signature, .. } => {
                settled.insert(signature.slug());
            }
            Entry::Unminimized {
                signature, reason, ..
            } => {
                let n = attempts.entry(signature.slug()).or_insert(0);
                *n += 1;
                if !reason.retryable() || *n >= MINIMIZE_ATTEMPTS {
                    settled.insert(signature.slug());
                }
            }
            Entry::Start { .. } | Entry::Reported { .. } => {}
        }
    }
    pending.retain(|(_, s, _)| !settled.contains(&s.slug()));
    let state = Mutex::new(State {
        journal,
        done,
        found,
        entries,
        unstable: 0,
    });

    let started = Instant::now();
    let over_budget = || opts.budget.is_some_and(|b| started.elapsed() >= b);
    // Findings whose minimization a killed session did not finish, on one
    // pool thread: a worker child dies with the thread that started it.
    crate::device::cpu_pool(1)?.install(|| -> Result<()> {
        let mut executor = Executor::new(&opts.workers, opts.limits.clone());
        for (index, signature, case) in pending {
            if over_budget() {
                break; // the next session goes on with them
            }
            let job = reproduce_job(&case, &signature, opts, index, started);
            let tried = attempts.get(&signature.slug()).copied().unwrap_or(0);
            settle_finding(&mut executor, &state, &job, tried)?;
        }
        Ok(())
    })?;

    let progress = progress_bar(opts);
    let next_local = AtomicU64::new(0);
    let session_runs = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..opts.jobs.max(1) {
            scope.spawn(|| {
                let result = crate::device::cpu_pool(1).and_then(|pool| {
                    pool.install(|| {
                        worker(
                            opts,
                            &state,
                            &next_local,
                            &session_runs,
                            &stop,
                            started,
                            &progress,
                        )
                    })
                });
                if let Err(e) = result {
                    stop.store(true, Ordering::SeqCst);
                    first_error.lock().expect("poisoned").get_or_insert(e);
                }
            });
        }
    });
    progress.finish_and_clear();
    if let Some(e) = first_error.into_inner().expect("poisoned") {
        return Err(e);
    }
    let mut st = state.into_inner().expect("campaign state poisoned");
    let new = unreported(&st.entries);
    let summary = summarize(
        opts,
        &st.entries,
        new.clone(),
        session_runs.load(Ordering::SeqCst),
        started.elapsed(),
    );
    crate::files::write_atomic(
        &out.join(SUMMARY_FILE),
        serde_json::to_string_pretty(&summary)
            .expect("summary serializes")
            .as_bytes(),
    )?;
    write_reports(out, &st.entries)?;
    if !new.is_empty() {
        // Last: a session killed before this line leaves them to the next one.
        st.append(vec![Entry::Reported { signatures: new }])?;
    }
    Ok(summary)
}

/// The signatures found in a journal that no session has reported yet.
pub fn unreported(entries: &[Entry]) -> Vec<String> {
    let reported: BTreeSet<&String> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Reported { signatures } => Some(signatures),
            _ => None,
        })
        .flatten()
        .collect();
    let mut new = Vec::new();
    for e in entries {
        if let Entry::Finding { signature, .. } = e {
            let slug = signature.slug();
            if !reported.contains(&slug) && !new.contains(&slug) {
                new.push(slug);
            }
        }
    }
    new
}

/// Writes `report.json`, `report.md` and `report.html` of a campaign's entries.
pub fn write_reports(out: &Path, entries: &[Entry]) -> Result<()> {
    let report = crate::report::StabilityReport::from_entries(entries);
    let write =
        |name: &str, text: String| crate::files::write_atomic(&out.join(name), text.as_bytes());
    write("report.json", report.to_json())?;
    write("report.md", report.to_markdown())?;
    write("report.html", report.to_html())
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

fn progress_bar(opts: &CampaignOptions) -> indicatif::ProgressBar {
    if !opts.progress {
        return indicatif::ProgressBar::hidden();
    }
    let bar = match opts.runs {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos} runs {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

#[allow(clippy::too_many_arguments)]
fn worker(
    opts: &CampaignOptions,
    state: &Mutex<State>,
    next_local: &AtomicU64,
    session_runs: &AtomicU64,
    stop: &AtomicBool,
    started: Instant,
    progress: &indicatif::ProgressBar,
) -> Result<()> {
    let mut executor = Executor::new(&opts.workers, opts.limits.clone());
    loop {
        if stop.load(Ordering::SeqCst) || opts.budget.is_some_and(|b| started.elapsed() >= b) {
            return Ok(());
        }
        // The next local index of this shard that is not journaled yet.
        let (index, case) = {
            let st = state.lock().expect("campaign state poisoned");
            let local = loop {
                let l = next_local.fetch_add(1, Ordering::SeqCst);
                if !st.done.contains(&(opts.shard.index + l * opts.shard.count)) {
                    break l;
                }
            };
            if opts.runs.is_some_and(|n| local >= n) {
                return Ok(());
            }
            let index = opts.shard.index + local * opts.shard.count;
            (index, case_for(index, opts, &st.found))
        };
        let t0 = Instant::now();
        let record = executor.run(index, &case)?;
        let millis = t0.elapsed().as_millis() as u64;
        let unstable = record.verdict == Verdict::Unstable;
        let signature = record.signature.clone();
        let entry = Entry::run(index, &case, record, millis);
        let new_finding = {
            let mut st = state.lock().expect("campaign state poisoned");
            let new = signature.filter(|sig| !st.found.contains_key(&sig.slug()));
            let mut group = vec![entry];
            if let Some(sig) = &new {
                group.push(Entry::Finding {
                    index,
                    signature: sig.clone(),
                    case: Box::new(case.clone()),
                });
            }
            // The run and its finding in one write: no kill separates them.
            st.append(group)?;
            st.done.insert(index);
            if let Some(sig) = &new {
                st.found.insert(sig.slug(), case.clone());
            }
            let runs = session_runs.fetch_add(1, Ordering::SeqCst) + 1;
            let rate = runs as f64 / started.elapsed().as_secs_f64().max(1e-9);
            st.unstable += u64::from(unstable);
            let unstable = st.unstable;
            progress.set_message(format!(
                "{rate:.1} runs/s, {unstable} findings, {} signatures",
                st.found.len()
            ));
            progress.set_position(st.done.len() as u64);
            new
        };
        if let Some(sig) = new_finding {
            let job = reproduce_job(&case, &sig, opts, index, started);
            settle_finding(&mut executor, state, &job, 0)?;
        }
    }
}

/// The summary of a campaign's journal entries.
pub fn summarize(
    opts: &CampaignOptions,
    entries: &[Entry],
    new: Vec<String>,
    session_runs: u64,
    elapsed: Duration,
) -> Summary {
    let mut sigs: BTreeMap<String, SignatureSummary> = BTreeMap::new();
    let (mut runs, mut stable, mut unstable, mut rejected, mut errors) = (0, 0, 0, 0, 0);
    let mut seen_runs = BTreeSet::new();
    let mut unminimized: BTreeMap<String, String> = BTreeMap::new();
    for e in entries {
        match e {
            Entry::Run {
                index,
                verdict,
                signature,
                ..
            } => {
                if !seen_runs.insert(*index) {
                    continue; // merged shards may repeat a run
                }
                runs += 1;
                match verdict {
                    Verdict::Stable => stable += 1,
                    Verdict::Unstable => unstable += 1,
                    Verdict::Rejected => rejected += 1,
                    Verdict::Error | Verdict::Panic | Verdict::Crash | Verdict::Timeout => {
                        errors += 1
                    }
                }
                if let Some(sig) = signature {
                    let s = sigs.entry(sig.slug()).or_insert_with(|| SignatureSummary {
                        slug: sig.slug(),
                        signature: sig.clone(),
                        count: 0,
                        first_index: *index,
                        reproducer: None,
                        unminimized: None,
                    });
                    s.count += 1;
                    s.first_index = s.first_index.min(*index);
                }
            }
            Entry::Reproducer {
                signature, file, ..
            } => {
                if let Some(s) = sigs.get_mut(&signature.slug()) {
                    if s.reproducer.as_ref().is_none_or(|f| file < f) {
                        s.reproducer = Some(file.clone());
                    }
                }
            }
            Entry::Unminimized {
                signature, message, ..
            } => {
                unminimized.insert(signature.slug(), message.clone());
            }
            _ => {}
        }
    }
    for s in sigs.values_mut().filter(|s| s.reproducer.is_none()) {
        s.unminimized = unminimized.get(&s.slug).cloned();
    }
    let secs = elapsed.as_secs_f64();
    Summary {
        seed: opts.seed,
        families: opts.strategy.families.clone(),
        shard: (opts.shard.index, opts.shard.count),
        runs,
        runs_this_session: session_runs,
        stable,
        unstable,
        rejected,
        errors,
        signatures: sigs.into_values().collect(),
        new_signatures: new,
        elapsed_s: secs,
        runs_per_s: if secs > 0.0 {
            session_runs as f64 / secs
        } else {
            0.0
        },
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

    #[test]
    fn reproducer_names_are_safe_and_stable() {
        let c = Case::example("cnn").unwrap();
        let sig = Signature {
            kind: crate::FindingKind::Nan,
            phase: crate::Phase::Augment,
            stage: "augment.normalize".into(),
            family: "cnn".into(),
            optimizer: "adam".into(),
            precision: "f32".into(),
            device: "cuda:0".into(),
        };
        let name = reproducer_name(&sig, &c);
        assert_eq!(name, reproducer_name(&sig, &c));
        assert!(
            name.starts_with("nan-augment-augment.normalize-cnn-adam-f32-cuda_0-"),
            "{name}"
        );
        assert!(
            name.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch)),
            "{name}"
        );
    }
}
