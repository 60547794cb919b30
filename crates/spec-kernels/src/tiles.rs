//! Which tile runs a product of f32 rows stored in spans, picked by timing the candidates.
//!
//! At 4 to 14 rows of `x` (a verification of K = 3 to 13) several tiles do such a product with
//! the same operations in the same order, so the same bits, and differ only in how they read
//! the weights from memory. Which one is fastest depends on the state of the machine's memory,
//! which on a 2-vCPU Zen 5 moves every few minutes between a fast state (the 1.5B's one-row
//! products in 86-95 ms) and a slow one (124-144 ms) (`docs/notes/vcpu-placement.md`).
//! The 1.5B's products ÷ one row in the same round, medians over the fast and slow rounds of
//! two runs (81 and 120 fast, 67 and 10 slow; measured at bfbef4e): 5
//! rows, one panel 1.25-1.29 fast and 1.05 slow, two panels with two streams 1.12-1.14 fast and
//! 1.18-1.21 slow; 7 rows, two panels 1.20-1.21 fast and 1.11 slow, with two streams 1.09 fast
//! and 1.21-1.24 slow; 9 rows, two panels 1.26-1.28 fast and 1.18-1.20 slow, with two streams
//! 1.17-1.18 and 1.19-1.22. Fixed choices (one panel to 5 rows, one stream at 6 and 7, two
//! from 8) take 7-13% more than the fastest at 5 to 7 rows when memory is fast.
//! So each product's shape keeps the recent times of its candidates, runs the fastest, runs
//! another every [`EXPLORE_EVERY`] products, and at once those whose times belong to another
//! state ([`STALE_SHARE`]); timed so, the products took 0-2.4% more than the fastest tile in
//! each state.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// A tile for a product of f32 rows stored in spans ([`crate::Exec::span_tile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanTile {
    /// AVX2's tiles in 8-lane vectors: two panels (4 weight rows) × up to 3 rows of `x` (a
    /// group's odd last panel one panel × up to 5); more rows take several tiles, the later
    /// ones reading the pieces again from L1.
    EightLanes,
    /// AVX-512's tile of two panels × every row of `x` (one panel at 15 and 16 rows), a panel's
    /// two rows side by side in 16-lane vectors, asking for the next two pieces of weights in
    /// address order: one stream of hints.
    TwoPanels,
    /// The same tile asking for each panel's weights in a stream of its own, two pieces ahead.
    TwoPanelStreams,
}

impl SpanTile {
    /// Every tile, in a fixed order.
    pub const ALL: [SpanTile; 3] = [
        SpanTile::EightLanes,
        SpanTile::TwoPanels,
        SpanTile::TwoPanelStreams,
    ];

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            SpanTile::EightLanes => "8-lane",
            SpanTile::TwoPanels => "two panels",
            SpanTile::TwoPanelStreams => "two panels, two streams",
        }
    }
}

/// The tiles timed against each other at `m` rows of `x`, the one run without timing first;
/// none where only one tile is worth running. The defaults are the best fixed choices: AVX2's
/// tiles up to 5 rows (16 registers hold them), one stream of hints at 6 and 7 rows and a
/// stream per panel from 8, which is faster in both memory states at 9 rows (measured at
/// bfbef4e). At 15 and 16 rows the two-panel tiles hold one panel, whose hints have no second
/// stream.
pub(crate) fn candidates(m: usize) -> &'static [SpanTile] {
    use SpanTile::{EightLanes, TwoPanelStreams, TwoPanels};
    match m {
        4 => &[EightLanes, TwoPanels],
        5 => &[EightLanes, TwoPanels, TwoPanelStreams],
        6..=7 => &[TwoPanels, TwoPanelStreams],
        8..=14 => &[TwoPanelStreams, TwoPanels],
        _ => &[],
    }
}

/// The tile run at `m` rows of `x` when none is asked for and none is timed.
pub(crate) fn default_tile(m: usize) -> SpanTile {
    match candidates(m).first() {
        Some(&tile) => tile,
        None if (15..=16).contains(&m) => SpanTile::TwoPanels,
        None => SpanTile::EightLanes,
    }
}

/// The most recent times of a tile kept per shape; their median is the tile's time, so that
/// one or two stalled products (another process, a page fault) do not move it, and three
/// products in a new state of the machine do.
const WINDOW: usize = 5;

/// Every this many products of a shape one runs the candidate other than the fastest that ran
/// longest ago, so that a slow drift is followed. Each candidate is at most a few tens of
/// percent slower than the fastest, so this costs well under 1% of the products' time (a
/// forward pass of the 1.5B runs each of its layer shapes 28 times). Every 8th product costs
/// 1.5–3% where the fixed choice is right (measured at bfbef4e).
const EXPLORE_EVERY: u64 = 32;

/// A change of the machine's state moves every time by 25–45%, and the candidates' order with
/// it. When the fastest's median has moved by more than this share since most of another
/// candidate's recent times were taken, those times are stale, and the candidate is run again
/// at once (every [`STALE_EXPLORE_EVERY`] products) instead of waiting for its turn: waiting,
/// the times of the other state decided for a hundred products or more.
const STALE_SHARE: f64 = 0.15;

/// How often a stale candidate runs, at most (see [`STALE_SHARE`]).
const STALE_EXPLORE_EVERY: u64 = 4;

/// A product's shape, as timed: output rows, input columns, rows of `x`, split over threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    pub rows: usize,
    pub cols: usize,
    pub m: usize,
    pub parallel: bool,
}

/// One candidate's recent times at one shape.
#[derive(Debug, Clone, Copy, Default)]
struct TileTimes {
    recent: [f64; WINDOW],
    /// For each of `recent`, the fastest candidate's median when it was taken.
    levels: [f64; WINDOW],
    timed: usize,
    last_call: u64,
    runs: u64,
}

impl TileTimes {
    /// Whether fewer than half the recent times were taken near `level`, the fastest
    /// candidate's median now ([`STALE_SHARE`]).
    fn stale(&self, level: f64) -> bool {
        let n = self.timed.min(WINDOW);
        let near = self.levels[..n]
            .iter()
            .filter(|&&then| (then / level - 1.0).abs() <= STALE_SHARE)
            .count();
        near < WINDOW / 2 + 1
    }

    fn median(&self) -> f64 {
        let n = self.timed.min(WINDOW);
        if n == 0 {
            return f64::INFINITY;
        }
        let mut times = self.recent;
        let times = &mut times[..n];
        times.sort_by(f64::total_cmp);
        times[n / 2]
    }
}

/// The candidates' times at one shape.
#[derive(Debug, Clone, Default)]
struct ShapeTimes {
    calls: u64,
    tiles: [TileTimes; SpanTile::ALL.len()],
}

impl ShapeTimes {
    /// Which of `candidates` (by position) runs the next product.
    fn pick(&mut self, candidates: &[SpanTile]) -> usize {
        self.calls += 1;
        let n = candidates.len().min(self.tiles.len());
        let tiles = &self.tiles[..n];
        // Each candidate is timed `WINDOW` times first, taking turns.
        let least_timed = (0..n).min_by_key(|&i| tiles[i].timed);
        let chosen = match least_timed {
            Some(i) if tiles[i].timed < WINDOW => i,
            _ => {
                let fastest = fastest(tiles);
                let level = tiles[fastest].median();
                let others = || (0..n).filter(|&i| i != fastest);
                let stale = others()
                    .filter(|&i| tiles[i].stale(level))
                    .min_by_key(|&i| tiles[i].last_call);
                match stale {
                    Some(i) if self.calls.is_multiple_of(STALE_EXPLORE_EVERY) => i,
                    _ if self.calls.is_multiple_of(EXPLORE_EVERY) => others()
                        .min_by_key(|&i| tiles[i].last_call)
                        .unwrap_or(fastest),
                    _ => fastest,
                }
            }
        };
        let tile = &mut self.tiles[chosen];
        tile.last_call = self.calls;
        tile.runs += 1;
        chosen
    }

    /// Keeps a product's time (seconds) for the candidate at `index`; a time that is not a
    /// finite number ≥ 0 is dropped.
    fn record(&mut self, index: usize, seconds: f64) {
        let level = self.tiles[fastest(&self.tiles)].median();
        if let Some(tile) = self.tiles.get_mut(index)
            && seconds.is_finite()
            && seconds >= 0.0
        {
            tile.recent[tile.timed % WINDOW] = seconds;
            // The first time of a shape has no level: its own.
            tile.levels[tile.timed % WINDOW] = if level.is_finite() { level } else { seconds };
            tile.timed += 1;
        }
    }
}

/// The position of the tile with the least median time (untimed ones last).
fn fastest(tiles: &[TileTimes]) -> usize {
    (0..tiles.len())
        .min_by(|&a, &b| tiles[a].median().total_cmp(&tiles[b].median()))
        .unwrap_or(0)
}

/// Every timed shape's candidates' times, for the process (products of one shape, whichever
/// matrix, run alike).
fn times() -> MutexGuard<'static, HashMap<Shape, ShapeTimes>> {
    static TIMES: OnceLock<Mutex<HashMap<Shape, ShapeTimes>>> = OnceLock::new();
    // A panic elsewhere while the lock was held leaves times that are still times.
    TIMES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A timed product under way ([`choose`]).
pub(crate) struct Timing {
    shape: Shape,
    index: usize,
    started: Instant,
}

impl Timing {
    /// Keeps the product's time, now that it has run.
    pub(crate) fn finish(self) {
        let seconds = self.started.elapsed().as_secs_f64();
        if let Some(times) = times().get_mut(&self.shape) {
            times.record(self.index, seconds);
        }
    }
}

/// The tile a product of `shape` runs: `asked` if given; else, where `applies` (the product
/// takes the tile it is given, [`crate::avx2::span_tiles_apply`]) and several tiles are
/// candidates at its rows of `x`, the one timing picks, with the [`Timing`] to finish once the
/// product has run; else [`default_tile`].
pub(crate) fn choose(
    shape: Shape,
    asked: Option<SpanTile>,
    applies: impl FnOnce() -> bool,
) -> (SpanTile, Option<Timing>) {
    let candidates = candidates(shape.m);
    if let Some(tile) = asked {
        return (tile, None);
    }
    if candidates.len() < 2 || !applies() {
        return (default_tile(shape.m), None);
    }
    let index = times().entry(shape).or_default().pick(candidates);
    let started = Instant::now();
    let timing = Timing {
        shape,
        index,
        started,
    };
    (candidates[index], Some(timing))
}

/// How often each tile ran the timed products of one shape in this process.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanTileUse {
    /// Output rows of the matrix.
    pub rows: usize,
    /// Input columns of the matrix.
    pub cols: usize,
    /// Rows of `x`.
    pub m: usize,
    /// Whether the product was split over the kernels' threads.
    pub parallel: bool,
    /// Products run by each candidate, with the median of its recent times (seconds).
    pub runs: Vec<(SpanTile, u64, f64)>,
}

/// The tiles that the timed products ([`crate::Exec::span_tile`] `None`) ran in this process,
/// shape by shape (ordered by rows of `x`, then matrix shape).
pub fn span_tile_uses() -> Vec<SpanTileUse> {
    let mut uses: Vec<SpanTileUse> = times()
        .iter()
        .map(|(shape, times)| SpanTileUse {
            rows: shape.rows,
            cols: shape.cols,
            m: shape.m,
            parallel: shape.parallel,
            runs: candidates(shape.m)
                .iter()
                .zip(&times.tiles)
                .map(|(&tile, t)| (tile, t.runs, t.median()))
                .collect(),
        })
        .collect();
    uses.sort_by_key(|u| (u.m, u.rows, u.cols, u.parallel));
    uses
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `calls` products on `times`, each candidate taking the time `cost(index, call)`;
    /// returns how often each ran.
    fn run(
        times: &mut ShapeTimes,
        candidates: &[SpanTile],
        calls: usize,
        cost: impl Fn(usize, usize) -> f64,
    ) -> Vec<usize> {
        let mut ran = vec![0; candidates.len()];
        for call in 0..calls {
            let i = times.pick(candidates);
            ran[i] += 1;
            times.record(i, cost(i, call));
        }
        ran
    }

    #[test]
    fn the_fastest_runs_and_the_others_are_tried_now_and_then() {
        let candidates = candidates(5);
        let mut times = ShapeTimes::default();
        // Warm-up: each timed WINDOW times, in turn.
        let first: Vec<usize> = (0..3 * WINDOW)
            .map(|_| {
                let i = times.pick(candidates);
                times.record(i, [1.0, 0.9, 1.1][i]);
                i
            })
            .collect();
        assert_eq!(&first[..3], &[0, 1, 2]);
        let calls = 50 * EXPLORE_EVERY as usize;
        let ran = run(&mut times, candidates, calls, |i, _| [1.0, 0.9, 1.1][i]);
        assert_eq!(
            ran[1],
            calls - 50,
            "one product in EXPLORE_EVERY explores: {ran:?}"
        );
        assert_eq!(
            (ran[0], ran[2]),
            (25, 25),
            "explorations take turns: {ran:?}"
        );
    }

    #[test]
    fn a_change_of_the_machine_changes_the_tile_within_a_few_products() {
        let candidates = candidates(7);
        let mut times = ShapeTimes::default();
        let every = EXPLORE_EVERY as usize;
        // Tile 0 faster for a while; then the memory's state changes: every time about 30%
        // shorter, and tile 1 faster (as the two-panel tiles' hints at 7 rows). Until tile 1
        // runs again, its times of the slow state make it look slower than it has become.
        let switch = 10 * every;
        let cost = |i: usize, call: usize| match (i, call < switch) {
            (0, true) => 0.14,
            (1, true) => 0.16,
            (0, false) => 0.10,
            _ => 0.09,
        };
        run(&mut times, candidates, switch, cost);
        let after = run(&mut times, candidates, 20 * every, |i, call| {
            cost(i, call + switch)
        });
        // Tile 0's median moves after 3 products, tile 1's times are then stale and it runs
        // every 4th product: 3 times make its median. Then tile 0 runs once in EXPLORE_EVERY.
        assert!(
            after[0] <= 3 + 3 * 4 + 20 + 1,
            "switched too late: {after:?}"
        );
        assert_eq!(times.pick(candidates), 1);
    }

    #[test]
    fn two_stalled_products_do_not_change_the_tile() {
        let candidates = candidates(9);
        let mut times = ShapeTimes::default();
        run(&mut times, candidates, 100, |i, _| [0.10, 0.11][i]);
        // The fastest stalls twice in a row (another process); 101 and 102 explore nothing.
        for _ in 0..2 {
            let i = times.pick(candidates);
            assert_eq!(i, 0);
            times.record(i, 5.0);
        }
        let every = EXPLORE_EVERY as usize;
        let ran = run(&mut times, candidates, every, |i, _| [0.10, 0.11][i]);
        assert_eq!(ran, vec![every - 1, 1]);
    }

    #[test]
    fn a_time_that_is_not_a_number_is_dropped() {
        let mut times = ShapeTimes::default();
        times.record(0, f64::NAN);
        times.record(0, -1.0);
        times.record(7, 1.0);
        assert_eq!(times.tiles[0].timed, 0);
        times.record(0, 0.5);
        assert_eq!(times.tiles[0].median(), 0.5);
    }

    #[test]
    fn candidates_start_with_the_untimed_choice() {
        assert_eq!(default_tile(1), SpanTile::EightLanes);
        assert_eq!(default_tile(5), SpanTile::EightLanes);
        assert_eq!(default_tile(6), SpanTile::TwoPanels);
        assert_eq!(default_tile(9), SpanTile::TwoPanelStreams);
        assert_eq!(default_tile(16), SpanTile::TwoPanels);
        assert_eq!(default_tile(17), SpanTile::EightLanes);
        assert!(candidates(1).is_empty() && candidates(15).is_empty());
    }
}
