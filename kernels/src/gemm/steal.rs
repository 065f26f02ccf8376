//! A range of a GEMM's row strips or B panels (or of batched attention's heads) that one thread
//! works through from the front while the others, once their own ranges are done, take small
//! pieces from its back.
//!
//! Why: a static split gives each of two threads half the work and the GEMM ends with the slower
//! one. On a shared VM the two cores are rarely equally fast (the Xeon of 2026-12-06, seventh
//! session: single-thread FMA loops side by side on its two vCPUs read 162 and 102 GFLOP/s, for
//! minutes), and in a server the HTTP side takes time from one engine thread at a time. The
//! owner still runs its share in the blocks of a static split (the same A packing and B reuse);
//! only the tail moves. (A shared counter over small blocks — onnxruntime's ParallelFor —
//! balances too but makes every block a short one that streams all of B; rayon's work stealing
//! splits recursively, which the GEMM's m blocking would then have to undo.)

use std::sync::atomic::{AtomicU64, Ordering};

use super::block::PanelSource;

/// Most tasks that get stealable ranges: [`even_ranges`] keeps them on the stack, so a split
/// allocates nothing (`Backend::run` allocates nothing: `compiler/tests/cpu_noalloc.rs`).
/// Beyond, the callers split without stealing.
pub(crate) const MAX_STEAL_TASKS: usize = 64;

/// `units` cut into `tasks` contiguous ranges of near-equal size (task t owns
/// `t·units/tasks .. (t+1)·units/tasks`), the slots past `tasks` empty.
/// `tasks <= MAX_STEAL_TASKS` and `units <= u32::MAX` (callers check both).
pub(crate) fn even_ranges(units: usize, tasks: usize) -> [StealRange; MAX_STEAL_TASKS] {
    std::array::from_fn(|t| {
        if t < tasks {
            let (a, b) = even_share(units, tasks, t);
            StealRange::new(a, b)
        } else {
            StealRange::new(0, 0)
        }
    })
}

/// Task t's share of `units` cut into `tasks` near-equal contiguous ranges:
/// `t·units/tasks .. (t+1)·units/tasks` (tasks > 0).
pub(crate) fn even_share(units: usize, tasks: usize, t: usize) -> (usize, usize) {
    (t * units / tasks, (t + 1) * units / tasks)
}

/// Units (strips or panels) `front..back`, packed as `back << 32 | front` so that one
/// compare-and-swap moves either end.
pub(crate) struct StealRange(AtomicU64);

impl StealRange {
    pub(crate) fn new(front: usize, back: usize) -> StealRange {
        debug_assert!(front <= back && back <= u32::MAX as usize);
        StealRange(AtomicU64::new(((back as u64) << 32) | front as u64))
    }

    /// Takes units from the front (the owner): `most`, or half of what is left (rounded up to a
    /// multiple of `least`) once that is less than twice `most`, but no fewer than `least` (nor
    /// more than is left). The owner's last pieces shrink, so what a thief finds at the end, or
    /// waits for when the owner's core is taken from it mid-piece, is small. The taken range, or
    /// None when empty.
    ///
    /// (The half was rounded to an even count for every caller until 2026-12-07, thirteenth
    /// session: batched attention's owners then took their last two heads as one piece, and at
    /// MiniLM 1×512 — 12 heads of 0.6 ms, 6 a thread — the other thread, finding nothing left
    /// to take, waited 0.45–0.9 ms of each layer's 4 ms attention; 0.17–0.32 ms since, about
    /// half a head.)
    pub(super) fn take_front(&self, most: usize, least: usize) -> Option<(usize, usize)> {
        self.take(|f, b| {
            let n = piece(most, b - f, least);
            let g = (f + n).min(b);
            ((g, b), (f, g))
        })
    }

    /// Takes units from the back (a thief): `n`, or half of what is left (rounded up to a
    /// multiple of `least`) once that is less than twice `n`, but no fewer than `least`: the
    /// taken range, or None when empty.
    pub(super) fn take_back(&self, n: usize, least: usize) -> Option<(usize, usize)> {
        self.take(|f, b| {
            let n = piece(n, b - f, least);
            let s = b.saturating_sub(n).max(f);
            ((f, s), (s, b))
        })
    }

    /// `cut(front, back)` gives the range left and the range taken, for a non-empty range.
    fn take(&self, cut: impl Fn(usize, usize) -> ((usize, usize), (usize, usize))) -> Option<(usize, usize)> {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let (f, b) = ((cur & 0xffff_ffff) as usize, (cur >> 32) as usize);
            if f >= b {
                return None;
            }
            let ((nf, nb), taken) = cut(f, b);
            let new = ((nb as u64) << 32) | nf as u64;
            match self.0.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(taken),
                Err(seen) => cur = seen,
            }
        }
    }
}

/// The units either end takes of `left`: `cap`, or half of `left` rounded up to a multiple of
/// `least` once that is smaller, but no fewer than `least` (and at least one).
fn piece(cap: usize, left: usize, least: usize) -> usize {
    let least = least.max(1);
    cap.min(left.div_ceil(2).next_multiple_of(least).max(least)).max(1)
}

/// One thread's way through the ranges of a split: its own from the front, `most` at a time,
/// then the others' from their backs, `bite` at a time; both halving what is left towards the
/// end, to no fewer than `least`.
pub(crate) struct Taker<'a> {
    pub(crate) own: usize,
    pub(crate) ranges: &'a [StealRange],
    pub(crate) most: usize,
    pub(crate) bite: usize,
    pub(crate) least: usize,
}

impl Taker<'_> {
    /// The next range this thread runs, or None when every range is empty.
    pub(crate) fn take(&mut self) -> Option<(usize, usize)> {
        let n = self.ranges.len();
        self.ranges[self.own].take_front(self.most, self.least).or_else(|| {
            (1..n).find_map(|v| self.ranges[(self.own + v) % n].take_back(self.bite, self.least))
        })
    }
}

/// A panel split of a GEMM with one k block and one m block: every thread has packed the same A,
/// so a tile column runs on whichever thread takes it.
impl PanelSource for Taker<'_> {
    fn start(&mut self) {}
    fn next(&mut self) -> Option<(usize, usize)> {
        self.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_and_back_cover_the_range_once() {
        let r = StealRange::new(3, 20);
        assert_eq!(r.take_front(5, 2), Some((3, 8)));
        assert_eq!(r.take_front(100, 2), Some((8, 14)), "half of the 12 left");
        assert_eq!(r.take_front(100, 4), Some((14, 18)), "no fewer than 4");
        let h = StealRange::new(0, 6);
        assert_eq!(h.take_front(4, 1), Some((0, 3)), "half of 6");
        assert_eq!(h.take_front(4, 1), Some((3, 5)), "half of 3, rounded up");
        assert_eq!(h.take_front(4, 1), Some((5, 6)), "the last one alone");
        assert_eq!(r.take_back(1, 1), Some((19, 20)));
        assert_eq!(r.take_back(100, 1), Some((18, 19)));
        assert_eq!(r.take_front(1, 1), None);
        assert_eq!(r.take_back(1, 1), None);
        let r = StealRange::new(0, 40);
        assert_eq!(r.take_back(16, 2), Some((24, 40)), "the bite while 32 or more are left");
        assert_eq!(r.take_back(16, 2), Some((12, 24)), "half of the 24 left");
        assert_eq!(r.take_back(16, 2), Some((6, 12)));
        assert_eq!(r.take_back(16, 4), Some((2, 6)), "no fewer than 4 (half of 6, rounded up to 4)");
        assert_eq!(r.take_back(16, 4), Some((0, 2)), "nor more than is left");
    }

    #[test]
    fn concurrent_takers_never_overlap() {
        let r = StealRange::new(0, 100_000);
        let seen: Vec<std::sync::atomic::AtomicU8> = (0..100_000).map(|_| std::sync::atomic::AtomicU8::new(0)).collect();
        std::thread::scope(|s| {
            for t in 0..4 {
                let (r, seen) = (&r, &seen);
                s.spawn(move || loop {
                    let got = if t == 0 { r.take_front(7, 2) } else { r.take_back(3, 1) };
                    let Some((a, b)) = got else { break };
                    for x in &seen[a..b] {
                        x.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert!(seen.iter().all(|x| x.load(Ordering::Relaxed) == 1));
    }
}
