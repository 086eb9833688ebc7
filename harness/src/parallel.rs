//! The one way nanhunt spreads work over cores: `jobs` worker threads, each
//! running candle in a one-thread compute pool (so results do not depend on
//! the number of jobs), pulling the next item from a shared counter. The
//! first error stops the other workers and is returned. Campaigns and LR
//! tables both run on it.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// What a worker sees: the next item to take, and whether to stop.
pub struct Queue {
    next: AtomicU64,
    stop: AtomicBool,
}

impl Queue {
    /// The next item number (0, 1, 2, … across all workers).
    pub fn take(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst)
    }

    /// Whether another worker failed: finish the current item and return.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// Runs `work` on `jobs` worker threads until each returns; the first
/// error (a worker's, or a pool that could not start) is the result.
pub fn run(jobs: usize, work: impl Fn(&Queue) -> Result<()> + Sync) -> Result<()> {
    let queue = Queue {
        next: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    };
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| {
                let result =
                    crate::device::cpu_pool(1).and_then(|pool| pool.install(|| work(&queue)));
                if let Err(e) = result {
                    queue.stop.store(true, Ordering::SeqCst);
                    first_error.lock().expect("poisoned").get_or_insert(e);
                }
            });
        }
    });
    match first_error.into_inner().expect("poisoned") {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_taken_once_and_the_first_error_stops_the_rest() {
        let seen = Mutex::new(Vec::new());
        run(3, |q| loop {
            let k = q.take();
            if k >= 20 {
                return Ok(());
            }
            seen.lock().unwrap().push(k);
        })
        .unwrap();
        let mut seen = seen.into_inner().unwrap();
        seen.sort_unstable();
        assert_eq!(seen, (0..20).collect::<Vec<_>>());
        let e = run(2, |q| {
            while !q.stopped() {
                if q.take() == 5 {
                    return Err(Error::option("item", "five"));
                }
            }
            Ok(())
        })
        .unwrap_err();
        assert!(e.to_string().contains("five"), "{e}");
    }
}
