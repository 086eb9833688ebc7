//! Threshold search on a log10 grid of learning rates: gallop outwards until
//! one end is stable and the other is not, bisect to one grid step, then
//! verify: sweep every grid LR within [`VERIFY_DECADES`] below the
//! bracket, and wherever one is unstable, move the threshold there and
//! sweep below it again. Instability is not monotone in the LR (a run can diverge at
//! 0.5 and train at 0.6), so bisection alone finds *a* transition; the
//! sweep makes the threshold the first unstable LR of the grid, down to a
//! stable stretch of [`VERIFY_DECADES`]. Unstable LRs below the top
//! transition are reported as islands.
//!
//! LR `i` of the grid is 10^(i·tolerance), so a bracket one index wide is
//! the stated tolerance in decades and a grid sweep of the same resolution
//! is "every index in the range". Every run is memoized by index and answers
//! both questions (diverged? non-finite?), and the NaN search starts from
//! the divergence bracket: a run that went non-finite has diverged, so the
//! NaN threshold comes out at or above the divergence threshold by
//! construction, even for a predicate that is not monotone in the LR.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What one training run at one LR showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// A NaN/Inf (or a half-precision overflow) appeared.
    pub non_finite: bool,
    /// The smoothed loss rose above the divergence factor × its best (or
    /// the run went non-finite).
    pub diverged: bool,
}

/// The log10 grid of learning rates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grid {
    /// Grid step in decades.
    pub tolerance: f64,
}

impl Grid {
    /// The learning rate at a grid index.
    pub fn lr(&self, index: i64) -> f64 {
        10f64.powf(index as f64 * self.tolerance)
    }

    /// The grid index nearest to `lr`.
    pub fn index(&self, lr: f64) -> i64 {
        (lr.log10() / self.tolerance).round() as i64
    }

    /// Indices per decade (at least one).
    fn decade(&self) -> i64 {
        ((1.0 / self.tolerance).round() as i64).max(1)
    }
}

/// Where a threshold lies: the first unstable LR and the stable LR one grid
/// step below it, or outside the searched range.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Threshold {
    /// A transition between two grid steps.
    Found {
        /// The largest LR seen stable.
        stable: f64,
        /// The smallest LR seen unstable.
        unstable: f64,
    },
    /// Unstable already at the lowest LR searched.
    BelowRange {
        /// The lowest LR searched.
        min: f64,
    },
    /// Still stable at the highest LR searched.
    AboveRange {
        /// The highest LR searched.
        max: f64,
    },
}

impl Threshold {
    /// An order on thresholds: the first unstable LR, 0 below the range and
    /// infinity above it.
    pub fn sort_key(&self) -> f64 {
        match *self {
            Threshold::Found { unstable, .. } => unstable,
            Threshold::BelowRange { .. } => 0.0,
            Threshold::AboveRange { .. } => f64::INFINITY,
        }
    }

    /// The largest LR seen stable (None below the range).
    pub fn stable(&self) -> Option<f64> {
        match *self {
            Threshold::Found { stable, .. } => Some(stable),
            Threshold::BelowRange { .. } => None,
            Threshold::AboveRange { max } => Some(max),
        }
    }

    /// The geometric middle of the bracket, the best point estimate.
    pub fn estimate(&self) -> Option<f64> {
        match *self {
            Threshold::Found { stable, unstable } => Some((stable * unstable).sqrt()),
            _ => None,
        }
    }
}

/// How far below a found threshold the verification sweep looks: a
/// stable stretch this long (every grid LR in it run) ends the search.
pub const VERIFY_DECADES: f64 = 0.8;

/// Unstable LRs below the top transition: the threshold is the lowest of
/// them, and above them the runs were stable again before the transition.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Islands {
    /// The lowest LR from which every LR run up to the top was unstable
    /// (the transition bisection alone would report); `None` when the
    /// highest run was stable again.
    pub onset: Option<f64>,
    /// Unstable stretches below `onset`, each [lowest, highest] LR run.
    pub unstable: Vec<[f64; 2]>,
}

impl Islands {
    /// Whether no island was found.
    pub fn is_empty(&self) -> bool {
        self.unstable.is_empty()
    }
}

/// Where the search starts and how far it may go, as grid indices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    /// The bracket's lower start.
    pub start_lo: i64,
    /// The bracket's upper start.
    pub start_hi: i64,
    /// The lowest index the search may reach.
    pub floor: i64,
    /// The highest index the search may reach.
    pub ceil: i64,
}

/// The result of searching both thresholds for one seed.
#[derive(Clone, Debug, PartialEq)]
pub struct Searched {
    /// The divergence threshold.
    pub divergence: Threshold,
    /// The non-finite threshold.
    pub non_finite: Threshold,
    /// Unstable stretches below the divergence threshold's transition.
    pub divergence_islands: Islands,
    /// Unstable stretches below the non-finite threshold's transition.
    pub non_finite_islands: Islands,
    /// Training runs made (distinct LRs).
    pub runs: usize,
    /// Runs a grid sweep of the same resolution over the same range
    /// (lowest to highest LR the search touched) would have made.
    pub grid_runs: usize,
}

struct Memo<'a, E> {
    eval: &'a mut dyn FnMut(i64) -> Result<Probe, E>,
    seen: BTreeMap<i64, Probe>,
}

impl<E> Memo<'_, E> {
    fn probe(&mut self, i: i64) -> Result<Probe, E> {
        if let Some(p) = self.seen.get(&i) {
            return Ok(*p);
        }
        let p = (self.eval)(i)?;
        self.seen.insert(i, p);
        Ok(p)
    }

    /// Searches the threshold of `unstable`, starting from the bracket
    /// [lo, hi] and galloping outwards (1, 2, 4, … decades) while it does
    /// not hold a stable low end and an unstable high end.
    fn threshold(
        &mut self,
        unstable: fn(&Probe) -> bool,
        grid: Grid,
        (mut lo, mut hi): (i64, i64),
        bottom: i64,
        range: Range,
    ) -> Result<Threshold, E> {
        let mut stride = grid.decade();
        while unstable(&self.probe(lo)?) {
            hi = lo;
            if lo <= range.floor {
                return Ok(Threshold::BelowRange { min: grid.lr(lo) });
            }
            lo = (lo - stride).max(range.floor);
            stride *= 2;
        }
        let mut stride = grid.decade();
        // A run already known to be unstable above `lo` narrows the gallop.
        if let Some((&i, _)) = self.seen.range(lo + 1..).find(|(_, p)| unstable(p)) {
            hi = hi.min(i).max(lo + 1);
        }
        while !unstable(&self.probe(hi)?) {
            lo = hi;
            if hi >= range.ceil {
                return self.stable_at_the_top(unstable, grid, hi, bottom, range);
            }
            hi = (hi + stride).min(range.ceil);
            stride *= 2;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if unstable(&self.probe(mid)?) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        let first = self.verify_below(unstable, grid, hi, bottom, range)?;
        if first <= range.floor {
            return Ok(Threshold::BelowRange {
                min: grid.lr(range.floor),
            });
        }
        Ok(Threshold::Found {
            stable: grid.lr(first - 1),
            unstable: grid.lr(first),
        })
    }

    /// The threshold when the highest run up to the ceiling `top` was
    /// stable: above the range, unless a run below was unstable (an island
    /// under a stable top) — then the first unstable LR, as with islands
    /// below a transition.
    fn stable_at_the_top(
        &mut self,
        unstable: fn(&Probe) -> bool,
        grid: Grid,
        top: i64,
        bottom: i64,
        range: Range,
    ) -> Result<Threshold, E> {
        let Some((&i, _)) = self.seen.iter().find(|(_, p)| unstable(p)) else {
            return Ok(Threshold::AboveRange { max: grid.lr(top) });
        };
        let first = self.verify_below(unstable, grid, i, bottom, range)?;
        Ok(Threshold::Found {
            stable: grid.lr(first - 1),
            unstable: grid.lr(first),
        })
    }

    /// Sweeps every grid index below the unstable `first`, down to a stable
    /// stretch of [`VERIFY_DECADES`] (or `bottom`, below which nothing can
    /// be unstable), moving `first` to every unstable index it meets.
    fn verify_below(
        &mut self,
        unstable: fn(&Probe) -> bool,
        grid: Grid,
        mut first: i64,
        bottom: i64,
        range: Range,
    ) -> Result<i64, E> {
        let depth = ((VERIFY_DECADES / grid.tolerance).round() as i64).max(1);
        let mut i = first - 1;
        while i >= range.floor.max(bottom) && i >= first - depth {
            if unstable(&self.probe(i)?) {
                first = i;
            }
            i -= 1;
        }
        Ok(first)
    }

    /// The islands of `unstable` among the runs made, below its top transition.
    fn islands(&self, unstable: fn(&Probe) -> bool, grid: Grid) -> Islands {
        let runs: Vec<(i64, bool)> = self.seen.iter().map(|(&i, p)| (i, unstable(p))).collect();
        // The onset: the start of the unstable stretch that reaches the top
        // (there is none when the highest run was stable).
        // With a stable highest run, every unstable stretch is an island.
        let top = match runs.iter().rposition(|&(_, u)| !u) {
            None => 0,
            Some(s) => s + 1,
        };
        let stretches: Vec<[f64; 2]> = runs[..top]
            .chunk_by(|a, b| a.1 == b.1)
            .filter(|stretch| stretch[0].1)
            .map(|stretch| [grid.lr(stretch[0].0), grid.lr(stretch[stretch.len() - 1].0)])
            .collect();
        if stretches.is_empty() {
            return Islands::default();
        }
        Islands {
            onset: runs.get(top).map(|r| grid.lr(r.0)),
            unstable: stretches,
        }
    }
}

/// Finds the divergence and the non-finite thresholds of one seed;
/// `eval(i)` trains at the grid's LR `i`.
pub fn search<E>(
    grid: Grid,
    range: Range,
    eval: &mut dyn FnMut(i64) -> Result<Probe, E>,
) -> Result<Searched, E> {
    let mut memo = Memo {
        eval,
        seen: BTreeMap::new(),
    };
    let start = (range.start_lo, range.start_hi.max(range.start_lo + 1));
    let divergence = memo.threshold(|p| p.diverged, grid, start, range.floor, range)?;
    // A non-finite run has diverged, so no LR below the (verified) first
    // divergence can be non-finite: the NaN sweep stops there.
    let non_finite = match divergence {
        // Stable at the ceiling means finite at the ceiling too.
        Threshold::AboveRange { max } => Threshold::AboveRange { max },
        Threshold::BelowRange { .. } => memo.threshold(
            |p| p.non_finite,
            grid,
            (range.floor, range.floor + 1),
            range.floor,
            range,
        )?,
        Threshold::Found { stable, unstable } => memo.threshold(
            |p| p.non_finite,
            grid,
            (grid.index(stable), grid.index(unstable)),
            grid.index(unstable),
            range,
        )?,
    };
    let divergence_islands = memo.islands(|p| p.diverged, grid);
    let non_finite_islands = memo.islands(|p| p.non_finite, grid);
    let (lowest, highest) = match (memo.seen.keys().next(), memo.seen.keys().next_back()) {
        (Some(&a), Some(&b)) => (a, b),
        _ => (0, -1),
    };
    Ok(Searched {
        divergence,
        non_finite,
        divergence_islands,
        non_finite_islands,
        runs: memo.seen.len(),
        grid_runs: (highest - lowest + 1) as usize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GRID: Grid = Grid { tolerance: 0.05 };
    const RANGE: Range = Range {
        start_lo: -80,
        start_hi: -20,
        floor: -160,
        ceil: 60,
    };

    fn run(d: i64, n: i64) -> (Searched, Vec<i64>) {
        let mut calls = Vec::new();
        let s = search::<()>(GRID, RANGE, &mut |i| {
            calls.push(i);
            Ok(Probe {
                diverged: i >= d,
                non_finite: i >= n,
            })
        })
        .unwrap();
        (s, calls)
    }

    #[test]
    fn monotone_thresholds_are_found_to_one_grid_step() {
        let (s, calls) = run(-30, -10);
        assert_eq!(
            s.divergence,
            Threshold::Found {
                stable: GRID.lr(-31),
                unstable: GRID.lr(-30)
            }
        );
        assert_eq!(
            s.non_finite,
            Threshold::Found {
                stable: GRID.lr(-11),
                unstable: GRID.lr(-10)
            }
        );
        // Every LR is run once.
        let mut unique = calls.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), calls.len());
        assert_eq!(s.runs, calls.len());
        assert!(s.runs < s.grid_runs, "{} vs {}", s.runs, s.grid_runs);
    }

    #[test]
    fn thresholds_outside_the_range_are_reported_as_such() {
        let (s, _) = run(-1000, -1000);
        assert_eq!(s.divergence, Threshold::BelowRange { min: GRID.lr(-160) });
        assert_eq!(s.non_finite, Threshold::BelowRange { min: GRID.lr(-160) });
        let (s, _) = run(1000, 1000);
        assert_eq!(s.divergence, Threshold::AboveRange { max: GRID.lr(60) });
        assert_eq!(s.non_finite, Threshold::AboveRange { max: GRID.lr(60) });
        let (s, _) = run(0, 1000);
        assert_eq!(s.non_finite, Threshold::AboveRange { max: GRID.lr(60) });
    }

    #[test]
    fn grid_maps_lrs_to_indices_and_back() {
        for i in [-160, -81, 0, 7, 60] {
            assert_eq!(GRID.index(GRID.lr(i)), i);
        }
        assert!((GRID.lr(-60) - 1e-3).abs() < 1e-15);
    }

    /// Diverged from `t` on and at the offsets `islands` below it;
    /// non-finite from `t + gap` on and at the offsets `nan` below `t`
    /// (which must be among `islands`: a non-finite run has diverged).
    fn with_islands<'a>(
        t: i64,
        islands: &'a [i64],
        gap: i64,
        nan: &'a [i64],
    ) -> impl Fn(i64) -> Probe + 'a {
        move |i| Probe {
            diverged: i >= t || islands.contains(&(t - i)),
            non_finite: i >= t + gap || nan.contains(&(t - i)),
        }
    }

    #[test]
    fn islands_below_the_transition_move_the_threshold_and_are_reported() {
        // Unstable from -30 on, and at -38..=-37 and -48..=-47 (0.4 and
        // 0.9 decades below the transition: the second is found from the first).
        let probe = with_islands(-30, &[7, 8, 17, 18], 1000, &[]);
        let s = search::<()>(GRID, RANGE, &mut |i| Ok(probe(i))).unwrap();
        assert_eq!(
            s.divergence,
            Threshold::Found {
                stable: GRID.lr(-49),
                unstable: GRID.lr(-48)
            }
        );
        assert_eq!(s.divergence_islands.onset, Some(GRID.lr(-30)));
        assert_eq!(
            s.divergence_islands.unstable,
            vec![[GRID.lr(-48), GRID.lr(-47)], [GRID.lr(-38), GRID.lr(-37)]]
        );
        assert!(s.non_finite_islands.is_empty());
        // Two sweeps of 16 runs on top of the bisection, still well under a
        // grid sweep (bench/lr_table_vs_grid.sh measures it on real models).
        assert!(
            s.runs * 3 <= s.grid_runs,
            "{} runs of {}",
            s.runs,
            s.grid_runs
        );
    }

    #[test]
    fn a_nan_island_under_a_finite_top_is_the_threshold_and_is_reported() {
        // Diverges from -30 on, non-finite only at -28..=-27: finite again
        // from -26 up to the ceiling, as a loss that saturates can be.
        let probe = |i: i64| Probe {
            diverged: i >= -30,
            non_finite: (-28..=-27).contains(&i),
        };
        let s = search::<()>(GRID, RANGE, &mut |i| Ok(probe(i))).unwrap();
        let Threshold::Found { unstable, .. } = s.non_finite else {
            panic!("{:?}", s.non_finite)
        };
        assert!(probe(GRID.index(unstable)).non_finite);
        assert!(!s.non_finite_islands.is_empty());
        assert_eq!(s.non_finite_islands.onset, None, "stable at the top");
        assert!(s.divergence_islands.is_empty(), "monotone divergence");
    }

    proptest! {
        // Islands anywhere within the verified depth (16 grid steps) below
        // a transition inside the range: the threshold is the first
        // unstable grid LR, for both predicates.
        #[test]
        fn the_threshold_is_the_first_unstable_grid_lr(
            t in -140i64..40,
            starts in proptest::collection::vec(1i64..=16, 0..4),
            lone in proptest::collection::vec(any::<bool>(), 4),
            gap in 0i64..20,
            nan_islands: bool,
        ) {
            // Islands one or two grid steps wide.
            let island = |(k, &o): (usize, &i64)| if lone[k] { vec![o] } else { vec![o, o + 1] };
            let offsets: Vec<i64> = starts.iter().enumerate().flat_map(island).collect();
            // NaN islands: divergence islands within the NaN sweep's reach.
            let nan: Vec<i64> = offsets
                .iter()
                .copied()
                .filter(|&o| nan_islands && o + gap <= 16)
                .collect();
            let probe = with_islands(t, &offsets, gap, &nan);
            let s = search::<()>(GRID, RANGE, &mut |i| Ok(probe(i))).unwrap();
            for (found, islands, unstable) in [
                (s.divergence, &s.divergence_islands, (|p: Probe| p.diverged) as fn(Probe) -> bool),
                (s.non_finite, &s.non_finite_islands, |p: Probe| p.non_finite),
            ] {
                let first = (RANGE.floor..=RANGE.ceil).find(|&i| unstable(probe(i)));
                match (found, first) {
                    (Threshold::Found { unstable: u, .. }, Some(f)) => prop_assert_eq!(GRID.index(u), f),
                    (Threshold::BelowRange { .. }, Some(f)) => prop_assert_eq!(f, RANGE.floor),
                    (Threshold::AboveRange { .. }, None) => {}
                    (found, first) => prop_assert!(false, "{:?} vs first unstable {:?}", found, first),
                }
                for [a, b] in &islands.unstable {
                    // Without an onset the highest run was stable again.
                    prop_assert!(a <= b && islands.onset.is_none_or(|o| *b < o));
                    prop_assert!(*a >= found.sort_key());
                }
            }
        }

        // Monotone predicates: the bracket holds the true thresholds.
        #[test]
        fn monotone_predicates_are_bracketed(d in -200i64..100, gap in 0i64..100) {
            let n = d + gap;
            let (s, _) = run(d, n);
            let clamp = |t: i64| t.clamp(RANGE.floor, RANGE.ceil + 1);
            match s.divergence {
                Threshold::Found { unstable, .. } => prop_assert_eq!(GRID.index(unstable), clamp(d)),
                Threshold::BelowRange { .. } => prop_assert!(d <= RANGE.floor),
                Threshold::AboveRange { .. } => prop_assert!(d > RANGE.ceil),
            }
            match s.non_finite {
                Threshold::Found { unstable, .. } => prop_assert_eq!(GRID.index(unstable), clamp(n)),
                Threshold::BelowRange { .. } => prop_assert!(n <= RANGE.floor),
                Threshold::AboveRange { .. } => prop_assert!(n > RANGE.ceil),
            }
        }

        // Any predicates at all (noisy, non-monotone), as long as a
        // non-finite run counts as diverged: the NaN threshold is never
        // below the divergence threshold, and brackets are one step wide
        // with a stable low end and an unstable high end.
        #[test]
        fn nan_threshold_is_never_below_divergence(bits in proptest::collection::vec(0u8..4, 221)) {
            let probe = |i: i64| {
                let b = bits[(i - RANGE.floor) as usize];
                Probe { non_finite: b == 3, diverged: b >= 2 }
            };
            let s = search::<()>(GRID, RANGE, &mut |i| Ok(probe(i))).unwrap();
            prop_assert!(s.non_finite.sort_key() >= s.divergence.sort_key());
            for (t, unstable) in [
                (s.divergence, (|p: Probe| p.diverged) as fn(Probe) -> bool),
                (s.non_finite, |p: Probe| p.non_finite),
            ] {
                if let Threshold::Found { stable, unstable: u } = t {
                    prop_assert_eq!(GRID.index(u) - GRID.index(stable), 1);
                    prop_assert!(!unstable(probe(GRID.index(stable))));
                    prop_assert!(unstable(probe(GRID.index(u))));
                }
            }
        }
    }
}
