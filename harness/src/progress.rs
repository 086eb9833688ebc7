//! How long-running library work (a campaign, an LR table) says how far it
//! is. The library never draws: the command line implements [`Progress`]
//! with a progress bar; library users pass their own or none.

/// Receives the progress of one job, possibly from several worker threads.
pub trait Progress: Send + Sync + std::fmt::Debug {
    /// The job begins: `total` items when it is known.
    fn start(&self, _total: Option<u64>) {}
    /// `done` items so far, and how it goes (empty: nothing new to say).
    fn update(&self, _done: u64, _status: &str) {}
    /// The job ended.
    fn finish(&self) {}
}

/// A shared receiver, as the options of a job hold it.
pub type Reporter = std::sync::Arc<dyn Progress>;

/// Reports nothing.
#[derive(Debug)]
pub struct Silent;

impl Progress for Silent {}

/// The receiver of an optional one.
pub fn or_silent(p: &Option<Reporter>) -> &dyn Progress {
    match p {
        Some(p) => p.as_ref(),
        None => &Silent,
    }
}
