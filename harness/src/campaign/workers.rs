//! Where a campaign's runs execute: in the worker thread itself, or in one
//! child process per worker (`nanhunt worker`, one compute thread each).
//! A child isolates a case that aborts, overflows its stack or is killed
//! for memory: the campaign journals that run as a `crash` with the way the
//! child died and starts a fresh child for the next case.
//!
//! Parent and child speak JSON lines over the child's stdin and stdout: a
//! [`Request`] per line in, a [`Response`] per line out. Both sides run the
//! same code ([`run_case`], [`super::reproduce::reproduce`]), so a campaign's results
//! do not depend on the kind of worker.
//!
//! A child cannot take the campaign down or outlive it: it runs in its own
//! process group, under an address-space limit, and (on Linux) is killed
//! when the thread that started it ends; a request past its time limit
//! kills it; a write to a child that died between requests is a dead
//! worker (replaced, the request sent again), never a SIGPIPE of the campaign.

use super::reproduce::ReproduceJob;
use crate::error::{Error, Result};
use crate::finding::Verdict;
use crate::journal::{Entry, Unminimized};
use crate::models::BuiltinFactory;
pub use crate::record::RunResult;
use crate::runner::RunOptions;
use crate::spec::{Case, Limits};
use crate::training::run_model;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

/// Fault injection for tests of the isolation: a child asked to run this
/// campaign index aborts the process instead.
pub const ABORT_INDEX_ENV: &str = "NANHUNT_WORKER_ABORT_INDEX";
/// Fault injection: a child closes its input and exits right after
/// answering this campaign index (the parent's next write meets a closed pipe).
pub const EXIT_AFTER_INDEX_ENV: &str = "NANHUNT_WORKER_EXIT_AFTER_INDEX";
/// Fault injection: a child asked to minimize a finding first found at this
/// campaign index aborts instead (the minimization's worker dies).
pub const ABORT_MINIMIZE_ENV: &str = "NANHUNT_WORKER_ABORT_MINIMIZE";
/// Fault injection: a child asked to run this campaign index sleeps forever.
pub const HANG_INDEX_ENV: &str = "NANHUNT_WORKER_HANG_INDEX";

/// What a campaign holds each worker request to.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerLimits {
    /// The cases' size limits.
    pub case: Limits,
    /// A run past this is killed and journaled as a `timeout` (process
    /// workers only: a thread cannot be stopped from outside).
    pub case_timeout: Duration,
    /// Each child's address-space limit in bytes (`RLIMIT_AS`); process
    /// workers on Unix only.
    pub memory_bytes: Option<u64>,
}

impl Default for WorkerLimits {
    fn default() -> Self {
        WorkerLimits {
            case: Limits::default(),
            case_timeout: DEFAULT_CASE_TIMEOUT,
            memory_bytes: None,
        }
    }
}

/// The default `--case-timeout`: the slowest of 1000 generated cases took
/// 0.32 s here (docs/PERFORMANCE-LOG.md); a run 200 times longer is stuck, even
/// on a slower runner or device.
pub const DEFAULT_CASE_TIMEOUT: Duration = Duration::from_secs(60);

/// What a child's address space holds besides the case's tensors (the
/// binary, thread stacks, allocator arenas), added to `--max-memory-mib`.
pub const CHILD_MEMORY_HEADROOM: u64 = 1 << 30;

/// How campaign workers run their cases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Workers {
    /// In the worker threads of the campaign's process.
    Threads,
    /// Each worker thread drives a child process of this executable, which
    /// must understand the hidden `worker` subcommand (the nanhunt binary).
    Processes {
        /// The executable (the nanhunt binary, or a user's).
        exe: PathBuf,
    },
}

/// Runs one case in this process under `limits`; a panic is caught and reported.
pub fn run_case(case: &Case, limits: &Limits) -> RunResult {
    let builtin = BuiltinFactory::new(&case.model);
    let Ok(factory) = crate::models::factory_for(case, None, &builtin) else {
        return failed(
            Verdict::Rejected,
            "a campaign runs built-in families and the registered model of its binary".into(),
        );
    };
    let options = RunOptions {
        limits: limits.clone(),
        ..RunOptions::default()
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_model(case, factory, &options)
    }));
    match outcome {
        Ok(Ok(outcome)) => RunResult::of(&outcome),
        Ok(Err(e)) => failed(Verdict::Error, e.to_string()),
        Err(_) => failed(Verdict::Panic, "the run panicked".into()),
    }
}

/// Borrowed when sent, owned when received.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request<'a> {
    /// Run a case.
    Run {
        /// The run's index.
        index: u64,
        /// Its case.
        case: Cow<'a, Case>,
        /// The limits it runs under.
        limits: Cow<'a, Limits>,
    },
    /// Minimize a finding into a reproducer.
    Reproduce(Cow<'a, ReproduceJob>),
}

/// A worker's answer, one JSON line.
#[derive(Debug, Serialize, Deserialize)]
pub enum Response {
    /// The run's result.
    Run(RunResult),
    /// The journal entry of the minimization (`reproducer` or
    /// `unminimized`), or the error that stopped it.
    Reproduce(std::result::Result<Entry, String>),
}

fn env_index(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The child's side: answers requests until its input ends.
pub fn serve(input: impl BufRead, mut output: impl Write) -> Result<()> {
    let abort_index = env_index(ABORT_INDEX_ENV);
    let exit_after = env_index(EXIT_AFTER_INDEX_ENV);
    let abort_minimize = env_index(ABORT_MINIMIZE_ENV);
    let hang_index = env_index(HANG_INDEX_ENV);
    for line in input.lines() {
        let line = line.map_err(|e| Error::io(Path::new("<stdin>"), e))?;
        let request: Request = serde_json::from_str(&line)
            .map_err(|e| Error::Worker(format!("malformed request: {e}")))?;
        let mut exit = false;
        let response = match request {
            Request::Run {
                index,
                case,
                limits,
            } => {
                if abort_index == Some(index) {
                    std::process::abort();
                }
                if hang_index == Some(index) {
                    loop {
                        std::thread::sleep(Duration::from_secs(3600));
                    }
                }
                exit = exit_after == Some(index);
                Response::Run(run_case(&case, &limits))
            }
            Request::Reproduce(job) => {
                if abort_minimize == Some(job.index) {
                    std::process::abort();
                }
                Response::Reproduce(super::reproduce::reproduce(&job).map_err(|e| e.to_string()))
            }
        };
        if exit {
            close_stdin();
        }
        let text = serde_json::to_string(&response).expect("responses serialize");
        writeln!(output, "{text}")
            .and_then(|()| output.flush())
            .map_err(|e| Error::io(Path::new("<stdout>"), e))?;
        if exit {
            return Ok(());
        }
    }
    Ok(())
}

/// Closes this process's standard input (fault injection only).
fn close_stdin() {
    #[cfg(unix)]
    // SAFETY: closing fd 0, which nothing in this process reads any more.
    unsafe {
        libc::close(0);
    }
}

/// How a request to a child failed.
#[derive(Debug)]
enum Failure {
    /// The child was gone before it took the request (nothing ran).
    Gone(String),
    /// The child died while answering.
    Died(String),
    /// The child ran past the request's time limit and was killed.
    TimedOut(Duration),
    /// The child was terminated from outside (SIGTERM, SIGINT, SIGHUP: a
    /// scheduler or a user ending the campaign's processes; a case cannot
    /// send them to itself): no verdict on its run.
    Terminated(String),
}

/// A running child and the pipes to it. Its answers arrive through a
/// reader thread, so that waiting for one can time out.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<std::io::Result<String>>,
}

impl Worker {
    fn spawn(exe: &Path, limits: &WorkerLimits) -> Result<Worker> {
        let mut command = Command::new(exe);
        command
            .arg("worker")
            .env("RAYON_NUM_THREADS", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        isolate(&mut command, limits.memory_bytes);
        let mut child = command.spawn().map_err(|e| Error::io(exe, e))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut stdout = stdout;
            loop {
                let mut line = String::new();
                let read = stdout.read_line(&mut line);
                let end = !matches!(read, Ok(n) if n > 0);
                if send.send(read.map(|_| line)).is_err() || end {
                    return;
                }
            }
        });
        Ok(Worker {
            child,
            stdin,
            lines,
        })
    }

    /// Sends one request and waits up to `timeout` for its response.
    fn call(
        &mut self,
        request: &Request,
        timeout: Duration,
    ) -> std::result::Result<Response, Failure> {
        let mut text = serde_json::to_string(request).expect("requests serialize");
        text.push('\n');
        let stdin = &mut self.stdin;
        if without_sigpipe(|| {
            stdin
                .write_all(text.as_bytes())
                .and_then(|()| stdin.flush())
        })
        .is_err()
        {
            return Err(self.death(Failure::Gone));
        }
        match self.lines.recv_timeout(timeout) {
            Ok(Ok(line)) if !line.is_empty() => serde_json::from_str(&line)
                .map_err(|e| Failure::Died(format!("the worker process answered garbage: {e}"))),
            Err(RecvTimeoutError::Timeout) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                Err(Failure::TimedOut(timeout))
            }
            _ => Err(self.death(Failure::Died)),
        }
    }

    /// Reaps a child whose pipe closed and describes its end, as `how`
    /// unless it was terminated from outside.
    fn death(&mut self, how: fn(String) -> Failure) -> Failure {
        let _ = self.child.kill();
        match self.child.wait() {
            Ok(status) if terminated(status) => Failure::Terminated(describe(status)),
            Ok(status) => how(describe(status)),
            Err(e) => how(format!("the worker process was lost: {e}")),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child in its own process group (a terminal's Ctrl-C reaches the
/// campaign, whose death then ends it), killed when the thread that started
/// it ends (Linux: so an executor must stay on one thread), under an
/// address-space limit.
fn isolate(command: &mut Command, memory_bytes: Option<u64>) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        command.process_group(0);
        let parent = std::process::id();
        let memory_bytes = memory_bytes.map(within_hard_limit);
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only async-signal-safe functions (prctl, getppid, setrlimit).
        unsafe {
            command.pre_exec(move || {
                #[cfg(target_os = "linux")]
                {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // The parent may have died before the line above.
                    if libc::getppid() as u32 != parent {
                        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                    }
                }
                let _ = parent;
                if let Some(bytes) = memory_bytes {
                    let limit = libc::rlimit {
                        rlim_cur: bytes as libc::rlim_t,
                        rlim_max: bytes as libc::rlim_t,
                    };
                    if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }
    #[cfg(not(unix))]
    let _ = (command, memory_bytes);
}

/// `bytes`, or the address-space limit the campaign itself runs under when
/// that is lower: a child cannot raise a hard limit (`ulimit -v`), and
/// asking it to would stop every worker from starting. Said once.
#[cfg(unix)]
#[allow(clippy::unnecessary_cast)] // rlim_t is u64 on Linux, not everywhere
fn within_hard_limit(bytes: u64) -> u64 {
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut current) } != 0
        || current.rlim_max == libc::RLIM_INFINITY
        || current.rlim_max as u64 >= bytes
    {
        return bytes;
    }
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!(
            "warning: the address-space limit (ulimit -v) is {} MiB, below the {} MiB a worker is given (--max-memory-mib + headroom): workers run under {} MiB",
            current.rlim_max as u64 >> 20,
            bytes >> 20,
            current.rlim_max as u64 >> 20
        );
    });
    current.rlim_max as u64
}

/// Runs a write to a pipe with SIGPIPE blocked in this thread, so that a
/// closed pipe is an `EPIPE` error rather than the death of the campaign
/// (`main` restores SIGPIPE's default action for `nanhunt ... | head`).
fn without_sigpipe<T>(write: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
    #[cfg(target_os = "linux")]
    // SAFETY: plain signal-mask calls on this thread; the sigset is
    // initialized by sigemptyset before use.
    unsafe {
        let mut pipe: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut old);
        let result = write();
        if matches!(&result, Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe) {
            // Take the SIGPIPE the write raised before unblocking it.
            let now = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::sigtimedwait(&pipe, std::ptr::null_mut(), &now);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        result
    }
    #[cfg(not(target_os = "linux"))]
    write()
}

/// A worker terminated from outside is not its request's crash: the
/// campaign stops with the request unjournaled, and `--resume` redoes it.
fn terminated_outside(how: String) -> Error {
    Error::Worker(format!(
        "{how}: terminated from outside, not by its case; the campaign stops, and `--resume` runs it again"
    ))
}

/// Whether a child ended by a signal that only comes from outside.
fn terminated(status: std::process::ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        matches!(
            status.signal(),
            Some(libc::SIGTERM | libc::SIGINT | libc::SIGHUP)
        )
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        false
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            let name = match signal {
                libc::SIGABRT => " (SIGABRT: an abort, e.g. an allocation over the memory limit)",
                libc::SIGKILL => " (SIGKILL: killed, e.g. out of memory)",
                libc::SIGSEGV => " (SIGSEGV: e.g. a stack overflow)",
                _ => "",
            };
            return format!("the worker process died of signal {signal}{name}");
        }
    }
    format!("the worker process exited unexpectedly ({status})")
}

/// One campaign worker's way of running cases.
pub struct Executor {
    exe: Option<PathBuf>,
    limits: WorkerLimits,
    worker: Option<Worker>,
}

impl Executor {
    /// An executor of `workers`, each child process held to `limits`.
    pub fn new(workers: &Workers, limits: WorkerLimits) -> Executor {
        let exe = match workers {
            Workers::Threads => None,
            Workers::Processes { exe } => Some(exe.clone()),
        };
        Executor {
            exe,
            limits,
            worker: None,
        }
    }

    /// Sends a request to this worker's child, starting one if there is
    /// none; `None` for thread workers. A child found dead before it took
    /// the request is replaced and the request sent once more.
    fn call(
        &mut self,
        request: &Request,
        timeout: Duration,
    ) -> Result<Option<(u32, std::result::Result<Response, Failure>)>> {
        let Some(exe) = &self.exe else {
            return Ok(None);
        };
        for attempt in 0..2 {
            let worker = match &mut self.worker {
                Some(w) => w,
                slot => slot.insert(Worker::spawn(exe, &self.limits)?),
            };
            let pid = worker.child.id();
            let response = worker.call(request, timeout);
            if response.is_err() {
                self.worker = None; // dead: the next call starts a fresh one
            }
            match response {
                Err(Failure::Gone(how)) if attempt == 0 => {
                    eprintln!("warning: {how} between requests; starting a fresh one");
                }
                response => return Ok(Some((pid, response))),
            }
        }
        unreachable!("the second attempt returns")
    }

    /// Runs campaign run `index`; a dead child becomes a `crash` result, a
    /// child past the time limit a `timeout`.
    pub fn run(&mut self, index: u64, case: &Case) -> Result<RunResult> {
        let limits = self.limits.case.clone();
        let request = Request::Run {
            index,
            case: Cow::Borrowed(case),
            limits: Cow::Borrowed(&limits),
        };
        Ok(match self.call(&request, self.limits.case_timeout)? {
            None => run_case(case, &limits),
            Some((_, Ok(Response::Run(r)))) => r,
            Some((_, Ok(other))) => {
                return Err(Error::Worker(format!("answered {other:?} to a run")))
            }
            Some((_, Err(Failure::TimedOut(limit)))) => failed(
                Verdict::Timeout,
                format!(
                    "the run took longer than {:.0} s (--case-timeout); its worker was killed",
                    limit.as_secs_f64()
                ),
            ),
            Some((_, Err(Failure::Died(how) | Failure::Gone(how)))) => {
                failed(Verdict::Crash, self.with_memory_note(how))
            }
            Some((_, Err(Failure::Terminated(how)))) => return Err(terminated_outside(how)),
        })
    }

    /// Minimizes a finding; returns its journal entry: the reproducer, or
    /// why there is none (not reproducible, the worker died, time ran out).
    pub fn reproduce(&mut self, job: &ReproduceJob) -> Result<Entry> {
        // Every candidate run stays under the case timeout; the whole job
        // under the runs it may spend, or what is left of the budget.
        let per_run = self.limits.case_timeout;
        let all_runs = per_run.saturating_mul(job.minimize_runs.saturating_add(1) as u32);
        let timeout = job
            .time_limit
            .map_or(all_runs, |t| all_runs.min(t.saturating_add(per_run)));
        let unminimized = |reason, message| Entry::Unminimized {
            signature: job.signature.clone(),
            reason,
            message,
        };
        let (pid, response) = match self.call(&Request::Reproduce(Cow::Borrowed(job)), timeout)? {
            None => return super::reproduce::reproduce(job),
            Some(answer) => answer,
        };
        let entry = match response {
            Ok(Response::Reproduce(Ok(entry))) => return Ok(entry),
            Err(Failure::Terminated(how)) => return Err(terminated_outside(how)),
            Ok(Response::Reproduce(Err(e))) => return Err(Error::Worker(e)),
            Ok(other) => {
                return Err(Error::Worker(format!(
                    "answered {other:?} to a minimization"
                )))
            }
            Err(Failure::TimedOut(limit)) => unminimized(
                Unminimized::Timeout,
                format!(
                    "the minimization took longer than {:.0} s; its worker was killed",
                    limit.as_secs_f64()
                ),
            ),
            Err(Failure::Died(how) | Failure::Gone(how)) => {
                unminimized(Unminimized::WorkerDied, self.with_memory_note(how))
            }
        };
        // The dead child may have left a half-written reproducer.
        crate::files::remove_stale_temps(&job.out.join(super::reproduce::REPRO_DIR), Some(pid));
        Ok(entry)
    }

    fn with_memory_note(&self, how: String) -> String {
        match self.limits.memory_bytes {
            Some(b) => format!("{how}; the worker's address-space limit is {} MiB", b >> 20),
            None => how,
        }
    }
}

fn failed(verdict: Verdict, message: String) -> RunResult {
    RunResult {
        verdict,
        signature: None,
        step: None,
        losses: Vec::new(),
        message: Some(message),
        fidelity: None,
        pattern: None,
    }
}
