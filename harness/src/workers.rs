//! Where a campaign's runs execute: in the worker thread itself, or in one
//! child process per worker (`nanhunt worker`, one compute thread each).
//! A child isolates a case that aborts, overflows its stack or is killed
//! for memory: the campaign journals that run as a `crash` with the way the
//! child died and starts a fresh child for the next case.
//!
//! Parent and child speak JSON lines over the child's stdin and stdout: a
//! [`Request`] per line in, a [`Response`] per line out. Both sides run the
//! same code ([`run_case`], `campaign::reproduce`), so a campaign's results
//! do not depend on the kind of worker.

use crate::error::{Error, Result};
use crate::journal::Entry;
use crate::models::BuiltinFactory;
use crate::outcome::{Outcome, Signature};
use crate::runner::{run_model, RunOptions};
use crate::spec::Case;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// Fault injection for tests of the isolation: a child asked to run this
/// campaign index aborts the process instead.
pub const ABORT_INDEX_ENV: &str = "NANHUNT_WORKER_ABORT_INDEX";

/// How campaign workers run their cases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Workers {
    /// In the worker threads of the campaign's process.
    Threads,
    /// Each worker thread drives a child process of this executable, which
    /// must understand the hidden `worker` subcommand (the nanhunt binary).
    Processes { exe: PathBuf },
}

/// The result of one campaign run, as journaled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// stable, unstable, rejected, error, panic or crash.
    pub verdict: String,
    pub signature: Option<Signature>,
    pub step: Option<usize>,
    #[serde(with = "crate::floats::vec")]
    pub losses: Vec<f64>,
    pub message: Option<String>,
}

/// Runs one case in this process; a panic is caught and reported.
pub fn run_case(case: &Case) -> RunResult {
    let factory = BuiltinFactory::new(&case.model).expect("built-in family");
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_model(case, &factory, &RunOptions::default())
    }));
    let losses: Vec<f64> = match &outcome {
        Ok(Ok(o)) => o
            .trace()
            .map(|t| t.losses.iter().map(|&l| l as f32 as f64).collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    let (verdict, signature, step, message) = match outcome {
        Ok(Ok(Outcome::Stable { .. })) => ("stable", None, None, None),
        Ok(Ok(Outcome::Unstable { finding })) => (
            "unstable",
            Some(finding.signature.clone()),
            Some(finding.step),
            None,
        ),
        Ok(Ok(Outcome::Rejected { reason })) => ("rejected", None, None, Some(reason)),
        Ok(Err(e)) => ("error", None, None, Some(e.to_string())),
        Err(_) => ("panic", None, None, Some("the run panicked".to_string())),
    };
    RunResult {
        verdict: verdict.to_string(),
        signature,
        step,
        losses,
        message,
    }
}

/// What minimizing a finding needs besides the case.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReproduceJob {
    pub index: u64,
    pub case: Case,
    pub signature: Signature,
    pub out: PathBuf,
    pub minimize_runs: usize,
    pub campaign_seed: u64,
}

/// Borrowed when sent, owned when received.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request<'a> {
    Run { index: u64, case: Cow<'a, Case> },
    Reproduce(Cow<'a, ReproduceJob>),
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Response {
    Run(RunResult),
    /// The reproducer's journal entry, None when the finding did not
    /// reproduce, or the error that stopped it.
    Reproduce(std::result::Result<Option<Entry>, String>),
}

/// The child's side: answers requests until its input ends.
pub fn serve(input: impl BufRead, mut output: impl Write) -> Result<()> {
    let abort_index: Option<u64> = std::env::var(ABORT_INDEX_ENV)
        .ok()
        .and_then(|v| v.parse().ok());
    for line in input.lines() {
        let line = line.map_err(|e| Error::io(Path::new("<stdin>"), e))?;
        let request: Request = serde_json::from_str(&line)
            .map_err(|e| Error::invalid("worker request", e.to_string()))?;
        let response = match request {
            Request::Run { index, case } => {
                if abort_index == Some(index) {
                    std::process::abort();
                }
                Response::Run(run_case(&case))
            }
            Request::Reproduce(job) => {
                Response::Reproduce(crate::campaign::reproduce(&job).map_err(|e| e.to_string()))
            }
        };
        let text = serde_json::to_string(&response).expect("responses serialize");
        writeln!(output, "{text}")
            .and_then(|()| output.flush())
            .map_err(|e| Error::io(Path::new("<stdout>"), e))?;
    }
    Ok(())
}

/// A running child and the pipes to it.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn(exe: &Path) -> Result<Worker> {
        let mut child = Command::new(exe)
            .arg("worker")
            .env("RAYON_NUM_THREADS", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| Error::io(exe, e))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Worker {
            child,
            stdin,
            stdout,
        })
    }

    /// Sends one request and waits for its response; `Err` says how the
    /// child died.
    fn call(&mut self, request: &Request) -> std::result::Result<Response, String> {
        let text = serde_json::to_string(request).expect("requests serialize");
        let sent = writeln!(self.stdin, "{text}").and_then(|()| self.stdin.flush());
        let mut line = String::new();
        let read = sent.and_then(|()| self.stdout.read_line(&mut line));
        match read {
            Ok(n) if n > 0 => serde_json::from_str(&line)
                .map_err(|e| format!("the worker process answered garbage: {e}")),
            _ => Err(self.death()),
        }
    }

    /// Reaps a child whose pipe closed and describes its end.
    fn death(&mut self) -> String {
        let _ = self.child.kill();
        match self.child.wait() {
            Ok(status) => describe(status),
            Err(e) => format!("the worker process was lost: {e}"),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            let name = match signal {
                libc::SIGABRT => " (SIGABRT: an abort)",
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
    worker: Option<Worker>,
}

impl Executor {
    pub fn new(workers: &Workers) -> Executor {
        let exe = match workers {
            Workers::Threads => None,
            Workers::Processes { exe } => Some(exe.clone()),
        };
        Executor { exe, worker: None }
    }

    /// Sends a request to this worker's child, starting one if there is
    /// none; `None` for thread workers, `Some(Err)` with how a child died.
    fn call(&mut self, request: &Request) -> Result<Option<std::result::Result<Response, String>>> {
        let Some(exe) = &self.exe else {
            return Ok(None);
        };
        let worker = match &mut self.worker {
            Some(w) => w,
            slot => slot.insert(Worker::spawn(exe)?),
        };
        let response = worker.call(request);
        if response.is_err() {
            self.worker = None; // dead: the next call starts a fresh one
        }
        Ok(Some(response))
    }

    /// Runs campaign run `index`; a dead child becomes a `crash` result.
    pub fn run(&mut self, index: u64, case: &Case) -> Result<RunResult> {
        let request = Request::Run {
            index,
            case: Cow::Borrowed(case),
        };
        Ok(match self.call(&request)? {
            None => run_case(case),
            Some(Ok(Response::Run(r))) => r,
            Some(Ok(other)) => crash(format!("the worker process answered {other:?} to a run")),
            Some(Err(death)) => crash(death),
        })
    }

    /// Minimizes a finding; a child that dies while minimizing leaves the
    /// finding without a reproducer (a resumed campaign tries again).
    pub fn reproduce(&mut self, job: &ReproduceJob) -> Result<Option<Entry>> {
        match self.call(&Request::Reproduce(Cow::Borrowed(job)))? {
            None => crate::campaign::reproduce(job),
            Some(Ok(Response::Reproduce(Ok(entry)))) => Ok(entry),
            Some(Ok(Response::Reproduce(Err(e)))) => Err(Error::invalid("minimization", e)),
            Some(Ok(_) | Err(_)) => Ok(None),
        }
    }
}

fn crash(message: String) -> RunResult {
    RunResult {
        verdict: "crash".into(),
        signature: None,
        step: None,
        losses: Vec::new(),
        message: Some(message),
    }
}
