//! A team of helper threads that spin between jobs, for the many short products of a decode step.
//!
//! A SmolLM2 token is some 120 products of about 1 MB each, tens of microseconds apiece on two
//! cores. Rayon, called from outside its pool, parks the caller until a worker has run the job, and
//! its idle workers sleep on a futex after a few yields; the wake-ups cost about as long as the
//! product, so the second core buys little (docs/notes/cpu-kernels.md, "Threads"). Here the caller
//! runs parts itself and helpers that spin for a while after each job (`SPIN`) take the rest. A job
//! is *offered* to each helper; a helper *claims* it before reading it, and the caller *withdraws*
//! the offers nobody claimed once every part is done, so it never waits for a helper that is parked
//! or descheduled, only for one that is running a part.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long a helper spins for the next job before it parks.
const SPIN: Duration = Duration::from_millis(2);

/// Marks an offer as claimed in [`Slot::offer`].
const CLAIMED: u64 = 1 << 63;

type Job<'a> = dyn Fn(usize) + Sync + 'a;

struct Slot {
    /// 0: nothing offered; `e`: job `e` offered; `e | CLAIMED`: the helper took job `e`.
    offer: AtomicU64,
    /// The last job this helper finished.
    done: AtomicU64,
    parked: AtomicBool,
    thread: OnceLock<Thread>,
}

struct Shared {
    /// The current job; written only by the lock holder while no offer is open or claimed.
    job: UnsafeCell<Option<*const Job<'static>>>,
    parts: AtomicUsize,
    next: AtomicUsize,
    panicked: AtomicBool,
    slots: Vec<Slot>,
}

// SAFETY: `job` is written only by the thread holding `Team::lock`, between jobs, when every offer
// has been withdrawn or its job finished (`done`); a helper reads it only after claiming an offer
// (which happens-after the write) and stops before publishing `done`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// The process-wide team: [`Team::get`].
pub(crate) struct Team {
    shared: Arc<Shared>,
    /// The last job's number; held while a job runs.
    lock: Mutex<u64>,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team")
            .field("threads", &self.threads())
            .finish()
    }
}

impl Team {
    /// The team sized like rayon's global pool (`RAYON_NUM_THREADS` applies): the caller and
    /// `threads - 1` helpers.
    pub(crate) fn get() -> &'static Team {
        static TEAM: OnceLock<Team> = OnceLock::new();
        TEAM.get_or_init(|| Team::new(rayon::current_num_threads().saturating_sub(1)))
    }

    fn new(helpers: usize) -> Team {
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            parts: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            slots: (0..helpers)
                .map(|_| Slot {
                    offer: AtomicU64::new(0),
                    done: AtomicU64::new(0),
                    parked: AtomicBool::new(false),
                    thread: OnceLock::new(),
                })
                .collect(),
        });
        for index in 0..helpers {
            let for_helper = Arc::clone(&shared);
            let spawned = thread::Builder::new()
                .name(format!("spec-kernels-{index}"))
                .spawn(move || helper(&for_helper, index));
            if let Ok(handle) = spawned {
                let _ = shared.slots[index].thread.set(handle.thread().clone());
            }
        }
        Team {
            shared,
            lock: Mutex::new(0),
        }
    }

    /// The number of threads a job may run on, the caller's included.
    pub(crate) fn threads(&self) -> usize {
        self.shared.helpers().count() + 1
    }

    /// Runs `job(0) .. job(parts - 1)`, spread over the caller and the helpers; returns when all
    /// are done. If another thread is using the team (or a part calls this again), the caller runs
    /// every part itself.
    pub(crate) fn run(&self, parts: usize, job: &Job<'_>) {
        let mut last = match self.lock.try_lock() {
            Ok(guard) => guard,
            // A part that panicked on the caller unwound through the guard; the team is intact.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                (0..parts).for_each(job);
                return;
            }
        };
        let shared = &*self.shared;
        if self.threads() == 1 || parts <= 1 {
            (0..parts).for_each(job);
            return;
        }
        *last += 1;
        let epoch = *last;
        // SAFETY: no offer is open or claimed (the previous job's guard withdrew or waited for
        // each), so no helper reads `job` now. The lifetime is erased; the guard below keeps
        // `job` borrowed until every claimed offer is done, panics included.
        unsafe {
            let job = std::mem::transmute::<&Job<'_>, &'static Job<'static>>(job);
            *shared.job.get() = Some(job as *const Job<'static>);
        }
        shared.panicked.store(false, Ordering::Relaxed);
        shared.parts.store(parts, Ordering::Relaxed);
        shared.next.store(0, Ordering::Relaxed);
        for slot in shared.helpers() {
            slot.offer.store(epoch, Ordering::SeqCst);
            if slot.parked.swap(false, Ordering::SeqCst)
                && let Some(thread) = slot.thread.get()
            {
                thread.unpark();
            }
        }
        let guard = CloseOffers { shared, epoch };
        run_parts(shared, job);
        drop(guard);
        if shared.panicked.swap(false, Ordering::Relaxed) {
            panic!("a part of a parallel product panicked on a helper thread");
        }
    }
}

/// Withdraws the offers of job `epoch` that no helper claimed and waits for those claimed, also
/// while unwinding.
struct CloseOffers<'a> {
    shared: &'a Shared,
    epoch: u64,
}

impl Drop for CloseOffers<'_> {
    fn drop(&mut self) {
        for slot in self.shared.helpers() {
            let withdrawn = slot
                .offer
                .compare_exchange(self.epoch, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
            if withdrawn {
                continue;
            }
            let mut spins = 0u32;
            while slot.done.load(Ordering::Acquire) != self.epoch {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(4096) {
                    // The helper runs a part but may have lost its core to another process.
                    thread::yield_now();
                }
                std::hint::spin_loop();
            }
        }
        // SAFETY: every offer is withdrawn or done; no helper reads `job` until the next offer.
        unsafe {
            *self.shared.job.get() = None;
        }
    }
}

impl Shared {
    /// The slots whose helper thread was started (a failed spawn leaves its slot out).
    fn helpers(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().filter(|slot| slot.thread.get().is_some())
    }
}

fn run_parts(shared: &Shared, job: &Job<'_>) {
    let parts = shared.parts.load(Ordering::Relaxed);
    loop {
        let part = shared.next.fetch_add(1, Ordering::Relaxed);
        if part >= parts {
            break;
        }
        job(part);
    }
}

/// An offer not yet claimed, if `offer` holds one.
fn open_offer(offer: u64) -> Option<u64> {
    (offer != 0 && offer & CLAIMED == 0).then_some(offer)
}

fn helper(shared: &Shared, index: usize) {
    let slot = &shared.slots[index];
    loop {
        let mut idle_since = Instant::now();
        let mut spins = 0u32;
        let epoch = loop {
            let offer = slot.offer.load(Ordering::Acquire);
            if let Some(epoch) = open_offer(offer)
                && slot
                    .offer
                    .compare_exchange(epoch, epoch | CLAIMED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                break epoch;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && idle_since.elapsed() > SPIN {
                slot.parked.store(true, Ordering::SeqCst);
                if open_offer(slot.offer.load(Ordering::SeqCst)).is_none() {
                    thread::park();
                }
                slot.parked.store(false, Ordering::SeqCst);
                idle_since = Instant::now();
            }
            std::hint::spin_loop();
        };
        // SAFETY: the caller wrote `job` before offering it and keeps it alive until `done`.
        if let Some(job) = unsafe { *shared.job.get() } {
            let job: &Job<'_> = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| run_parts(shared, job))).is_err() {
                shared.panicked.store(true, Ordering::Relaxed);
            }
        }
        slot.done.store(epoch, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(parts: usize) -> Vec<AtomicUsize> {
        (0..parts).map(|_| AtomicUsize::new(0)).collect()
    }

    #[test]
    fn every_part_runs_exactly_once_across_many_jobs() {
        let team = Team::new(3);
        for parts in [0, 1, 2, 3, 7, 64] {
            for _ in 0..500 {
                let runs = counts(parts);
                team.run(parts, &|p| {
                    runs[p].fetch_add(1, Ordering::Relaxed);
                });
                assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
            }
        }
    }

    /// Runs two parts that each wait for the other: the job ends in time only if a helper took
    /// one of them.
    fn both_parts_meet(team: &Team) -> bool {
        let arrived = AtomicUsize::new(0);
        team.run(2, &|_| {
            arrived.fetch_add(1, Ordering::SeqCst);
            let start = Instant::now();
            while arrived.load(Ordering::SeqCst) < 2 && start.elapsed() < Duration::from_secs(5) {
                std::hint::spin_loop();
            }
        });
        arrived.load(Ordering::SeqCst) == 2
    }

    #[test]
    fn helpers_take_parts() {
        let team = Team::new(1);
        assert!(both_parts_meet(&team));
    }

    #[test]
    fn parked_helpers_wake_for_the_next_job() {
        let team = Team::new(1);
        for _ in 0..3 {
            thread::sleep(SPIN * 3);
            assert!(both_parts_meet(&team));
        }
    }

    #[test]
    fn nested_and_concurrent_calls_run_on_the_caller() {
        let team = Team::new(1);
        thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let runs = counts(4 * 3);
                        team.run(4, &|outer| {
                            team.run(3, &|inner| {
                                runs[outer * 3 + inner].fetch_add(1, Ordering::Relaxed);
                            });
                        });
                        assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
                    }
                });
            }
        });
    }

    #[test]
    fn a_panicking_part_reaches_the_caller_and_the_team_still_works() {
        let team = Team::new(1);
        for _ in 0..20 {
            let result = catch_unwind(AssertUnwindSafe(|| {
                team.run(8, &|p| assert_ne!(p, 5, "part 5 fails"));
            }));
            assert!(result.is_err());
            let runs = counts(8);
            team.run(8, &|p| {
                runs[p].fetch_add(1, Ordering::Relaxed);
            });
            assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
        }
    }
}
