//! Fuzz campaigns: generate cases (and mutate around what was found), run
//! them on parallel workers, dedup failures by signature, minimize every new
//! signature into a reproducer, and journal everything so that a killed
//! campaign resumes without losing a finding or writing a duplicate.
//!
//! Run indices are global: shard `i` of `n` runs indices `i, i+n, i+2n, …`,
//! and the case of an index is a function of (campaign seed, index) and of
//! the findings known when it was dispatched (mutation picks from them). With
//! one job the whole campaign is deterministic.

mod options;
mod placement;
mod reproduce;
mod resume;
mod summary;
mod user_report;
pub mod workers;

pub use options::{budget_text, parse_duration, CampaignOptions, Placement, Shard, MAX_SHARDS};
pub use reproduce::{reproduce, reproducer_name, ReproduceJob, REPRO_DIR};
pub use summary::{summarize, unreported, SignatureSummary, Summary, SUMMARY_FILE};
pub use user_report::{user_report, UserCampaign};

use crate::error::{Error, Result};
use crate::finding::{Signature, Verdict};
use crate::journal::{CampaignId, Entry, Journal, MINIMIZE_ATTEMPTS};
use crate::progress::Progress;
use crate::rng::Rng;
use crate::spec::*;
use crate::strategy::{generate, mutate};
use placement::Placer;
use resume::{Pending, Resumed};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use workers::Executor;

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
    let mut case = if !found.is_empty() && rng.uniform() < opts.mutation_rate {
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

/// The case a campaign with `opts` draws for run `index` while it has
/// found nothing: for running one run again on its own. With
/// `--mutation-rate 0` it is every run's draw but a rare one after the
/// first finding whose first draw is not a valid case (the fallback draw
/// then comes later in the dispatch stream).
pub fn drawn_case(opts: &CampaignOptions, index: u64) -> Case {
    case_for(index, opts, &BTreeMap::new())
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
        time_limit: Some(match opts.budget {
            Some(b) => b.saturating_sub(started.elapsed()),
            None => MINIMIZE_TIME_LIMIT,
        }),
    }
}

/// Checks a journal's entries as a resuming campaign does (every
/// finding's case validates); `journal` is named in the error.
pub fn check_resumable(entries: &[Entry], journal: &Path) -> Result<()> {
    Resumed::of(entries, journal).map(|_| ())
}

/// Runs a campaign to its budget; see the module docs.
pub fn run_campaign(opts: &CampaignOptions) -> Result<Summary> {
    run_campaign_then(opts, |_| {})
}

/// How long one minimization may shrink when the campaign has no time
/// budget (`--runs N`): it then writes the smallest case it reached. With a
/// budget, what is left of the budget bounds it instead.
pub const MINIMIZE_TIME_LIMIT: Duration = Duration::from_secs(10 * 60);

/// Fault injection for the exit-code test: the session aborts after it
/// reported its summary, before the journal records that it did.
pub const ABORT_BEFORE_REPORTED_ENV: &str = "NANHUNT_ABORT_BEFORE_REPORTED";

/// Runs a campaign to its budget, hands the summary to `report` (the CLI
/// prints it) and only then journals its new signatures as reported: a
/// session killed at any point before that last write leaves them to the
/// next session, which exits 1 for them. What remains is the exit itself,
/// after the journal's last write.
pub fn run_campaign_then(opts: &CampaignOptions, report: impl FnOnce(&Summary)) -> Result<Summary> {
    let (journal, entries) = open_journal(opts)?;
    let resumed = Resumed::of(&entries, &opts.out.join(crate::journal::JOURNAL_FILE))?;
    let state = Mutex::new(State {
        journal,
        done: resumed.done,
        found: resumed.found,
        entries,
        unstable: 0,
    });
    let started = Instant::now();
    let finished = finish_pending(opts, &state, resumed.pending, started);
    in_place(&state, finished)?;
    let ran = run_workers(opts, &state, started);
    let session_runs = in_place(&state, ran)?;
    // (`in_place` has checked that the directory is still the campaign's.)
    let mut st = state.into_inner().expect("campaign state poisoned");
    let summary = conclude(opts, &st, session_runs, started)?;
    report(&summary);
    if std::env::var_os(ABORT_BEFORE_REPORTED_ENV).is_some() {
        std::process::abort();
    }
    if !summary.new_signatures.is_empty() {
        st.append(vec![Entry::Reported {
            signatures: summary.new_signatures.clone(),
        }])?;
    }
    Ok(summary)
}

/// Opens (and locks) the campaign's journal: new, or one this campaign
/// wrote (same seed, families, data mode and shard) when resuming.
fn open_journal(opts: &CampaignOptions) -> Result<(Journal, Vec<Entry>)> {
    let out = &opts.out;
    let journal_path = out.join(crate::journal::JOURNAL_FILE);
    if journal_path.exists() && !opts.resume {
        return Err(Error::io(
            out,
            std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "holds a campaign journal: resume it, or choose another output directory",
            ),
        ));
    }
    opts.strategy.validate()?;
    crate::device::open(opts.device)?;
    // Locks the journal: from here on no other process writes in `out`.
    let (mut journal, entries) = Journal::open(out)?;
    // The lock is ours: every other writer's temp file is a killed one's.
    for dir in [out.clone(), out.join(REPRO_DIR)] {
        crate::files::remove_foreign_temps(&dir);
    }
    let mut entries = resume::reconcile(&out.join(REPRO_DIR), entries);
    let header = Entry::Start {
        nanhunt_version: env!("CARGO_PKG_VERSION").to_string(),
        seed: opts.seed,
        families: opts.strategy.families.clone(),
        clean_data: opts.strategy.clean_data,
        shard: (opts.shard.index, opts.shard.count),
        device: opts.device.to_string(),
        budget: budget_text(opts),
        data: opts.strategy.data_name(),
        mutation_rate: opts.mutation_rate,
        size: opts.strategy.scale,
    };
    match entries.first() {
        None => {
            journal.append(&header)?;
            entries.push(header);
        }
        Some(first) => {
            let (want, have) = (CampaignId::of(&header), CampaignId::of(first));
            let differences = match (&want, &have) {
                (Some(w), Some(h)) => w.differences(h, true),
                _ => vec!["its first line is not a campaign's start line".to_string()],
            };
            if !differences.is_empty() {
                return Err(Error::option(
                    "resume",
                    format!(
                        "{} was written by another campaign: {}",
                        journal_path.display(),
                        differences.join(", ")
                    ),
                ));
            }
        }
    }
    Ok((journal, entries))
}

/// Minimizes the findings a killed session left without a settled
/// reproducer, within the budget, on one pool thread (a worker child dies
/// with the thread that started it).
fn finish_pending(
    opts: &CampaignOptions,
    state: &Mutex<State>,
    pending: Vec<Pending>,
    started: Instant,
) -> Result<()> {
    crate::device::cpu_pool(1)?.install(|| {
        let mut executor = Executor::new(&opts.workers, opts.limits.clone());
        for p in pending {
            if opts.budget.is_some_and(|b| started.elapsed() >= b) {
                break; // the next session goes on with them
            }
            let job = reproduce_job(&p.case, &p.signature, opts, p.index, started);
            settle_finding(&mut executor, state, &job, p.attempts)?;
        }
        Ok(())
    })
}

/// Runs the campaign's workers to the budget; returns this session's runs.
/// The first worker error stops the others and is returned.
fn run_workers(opts: &CampaignOptions, state: &Mutex<State>, started: Instant) -> Result<u64> {
    let progress = crate::progress::or_silent(&opts.progress);
    progress.start(opts.runs);
    let session_runs = AtomicU64::new(0);
    let placement = Placer::new(opts.device, opts.placement);
    let ran = crate::parallel::run(opts.jobs, |queue| {
        worker(
            opts,
            state,
            queue,
            &placement,
            &session_runs,
            started,
            progress,
        )
    });
    progress.finish();
    ran.map(|()| session_runs.load(Ordering::SeqCst))
}

/// `result`, unless the campaign's directory was deleted or replaced under
/// it: then that error, the cause of whatever else failed (a worker that
/// found its reproducer directory gone).
fn in_place<T>(state: &Mutex<State>, result: Result<T>) -> Result<T> {
    state
        .lock()
        .expect("campaign state poisoned")
        .journal
        .check_in_place()?;
    result
}

/// Writes the summary and the reports.
fn conclude(
    opts: &CampaignOptions,
    st: &State,
    session_runs: u64,
    started: Instant,
) -> Result<Summary> {
    let new = unreported(&st.entries);
    let summary = summarize(opts, &st.entries, new, session_runs, started.elapsed());
    crate::files::write_atomic(
        &opts.out.join(SUMMARY_FILE),
        serde_json::to_string_pretty(&summary)
            .expect("summary serializes")
            .as_bytes(),
    )?;
    write_reports(&opts.out, &st.entries)?;
    Ok(summary)
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

fn worker(
    opts: &CampaignOptions,
    state: &Mutex<State>,
    queue: &crate::parallel::Queue,
    placement: &Placer,
    session_runs: &AtomicU64,
    started: Instant,
    progress: &dyn Progress,
) -> Result<()> {
    let mut executor = Executor::new(&opts.workers, opts.limits.clone());
    loop {
        if queue.stopped() || opts.budget.is_some_and(|b| started.elapsed() >= b) {
            return Ok(());
        }
        // The next local index of this shard that is not journaled yet.
        let (index, mut case) = {
            let st = state.lock().expect("campaign state poisoned");
            let local = loop {
                let l = queue.take();
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
        case.device = placement.place(&case);
        let t0 = Instant::now();
        let record = executor.run(index, &case)?;
        let millis = t0.elapsed().as_millis() as u64;
        // A run that errored or was rejected says nothing of a side's speed.
        if matches!(record.verdict, Verdict::Stable | Verdict::Unstable) {
            placement.observe(&case, millis, record.losses.len());
        }
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
            progress.update(
                st.done.len() as u64,
                &format!(
                    "{rate:.1} runs/s, {unstable} findings, {} signatures",
                    st.found.len()
                ),
            );
            new
        };
        if let Some(sig) = new_finding {
            let job = reproduce_job(&case, &sig, opts, index, started);
            settle_finding(&mut executor, state, &job, 0)?;
        }
    }
}
