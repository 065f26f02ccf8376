//! A small persistent thread pool: workers are spawned once, spin briefly after each job and then
//! park on a condvar. [`ThreadPool::run`] splits `n_tasks` task indices across the workers and the
//! calling thread; it neither allocates nor spawns.
//!
//! Protocol (one job at a time, guarded by `run_lock`):
//! - `state` packs `epoch << 32 | CLOSED | registered`. The caller writes the job slot while the
//!   state is closed with no worker registered, then publishes a new open epoch (SeqCst store).
//! - A worker that sees a new epoch registers with a CAS (only while open) and only then reads the
//!   job slot; it claims task indices from `next` until they run out, then unregisters.
//! - The caller runs tasks too until none is left to claim, closes the epoch and waits for the
//!   registered count to drop to zero (then every claimed task has finished). After that no worker can touch the job, so `run` may return
//!   and the borrowed closure may die.
//! - Sleeping: a worker increments `sleepers` and rechecks the epoch under `lock` before waiting;
//!   the caller publishes the epoch before reading `sleepers` (both SeqCst) and notifies under `lock`,
//!   so a wake-up cannot be lost.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const CLOSED: u64 = 1 << 31;
const COUNT_MASK: u64 = CLOSED - 1;

/// A task body: `(task_index, worker_index)`; worker 0 is the calling thread.
type TaskFn<'a> = dyn Fn(usize, usize) + Sync + 'a;

struct Job {
    /// Lifetime-erased pointer to the caller's closure; valid while a worker is registered.
    f: Option<*const TaskFn<'static>>,
    n_tasks: usize,
}

struct Shared {
    state: AtomicU64,
    job: UnsafeCell<Job>,
    next: AtomicUsize,
    panicked: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
    shutdown: AtomicBool,
    spin: Duration,
    /// Idle accounting ([`ThreadPool::watch_idle`]): on or off, the pool's time origin, the
    /// earliest moment a worker ran out of tasks in the current job (ns after `origin`;
    /// `u64::MAX` for none yet) and the idle time summed so far.
    watch: AtomicBool,
    origin: Instant,
    first_done: AtomicU64,
    idle_ns: AtomicU64,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
}

// SAFETY: `job` is written only by the thread holding `run_lock` while no worker is registered
// (state closed, count 0) and read only by registered workers (see the module protocol); the
// closure behind the pointer is `Sync`. All other fields are atomics or std sync primitives.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer in `job` is only dereferenced under the protocol.
unsafe impl Send for Shared {}

/// A persistent pool of `threads - 1` worker threads plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
    threads: usize,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("threads", &self.threads)
            .finish()
    }
}

impl ThreadPool {
    /// A pool that runs jobs on `threads` threads in total (the caller plus `threads - 1` workers).
    /// `threads <= 1` spawns nothing: every job runs inline on the caller.
    /// Workers spin for about 100 µs after a job before parking.
    pub fn new(threads: usize) -> ThreadPool {
        ThreadPool::with_spin(threads, Duration::from_micros(100))
    }

    /// Like [`ThreadPool::new`] with a chosen spin time before workers park.
    pub fn with_spin(threads: usize, spin: Duration) -> ThreadPool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: AtomicU64::new(CLOSED),
            job: UnsafeCell::new(Job {
                f: None,
                n_tasks: 0,
            }),
            next: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            spin,
            watch: AtomicBool::new(false),
            origin: Instant::now(),
            first_done: AtomicU64::new(u64::MAX),
            idle_ns: AtomicU64::new(0),
        });
        let mut workers = Vec::new();
        for w in 1..threads {
            let sh = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("kiln-worker-{w}"))
                .spawn(move || worker_loop(&sh, w));
            match spawned {
                Ok(h) => workers.push(h),
                // Could not spawn (resource limits): run with the threads we have.
                Err(_) => break,
            }
        }
        let threads = workers.len() + 1;
        ThreadPool {
            shared,
            workers,
            run_lock: Mutex::new(()),
            threads,
        }
    }

    /// Threads a job may run on, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Starts (or stops) counting how long threads wait at the end of each job ([`idle_ns`]).
    /// Off by default: it reads the clock twice per job and thread.
    ///
    /// [`idle_ns`]: Self::idle_ns
    pub fn watch_idle(&self, on: bool) {
        self.shared.watch.store(on, Ordering::Relaxed);
    }

    /// Nanoseconds, summed over the jobs run while [`watch_idle`](Self::watch_idle) was on, from
    /// the moment the first of the threads taking part in a job ran out of tasks to the job's
    /// end: with two threads, the time one of them waited for the other at the join. It is how
    /// well a split balances (a core slowed by another process, a last piece too big); jobs run
    /// inline on one thread count nothing.
    pub fn idle_ns(&self) -> u64 {
        self.shared.idle_ns.load(Ordering::Relaxed)
    }

    /// Runs `f(task)` for every `task in 0..n_tasks`, spread over the pool; returns when all are done.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        self.run_indexed(n_tasks, &|t, _w| f(t));
    }

    /// Runs `f(item, slot)` for every `item in 0..n_items` with `slot < slots`: jobs whose
    /// per-worker scratch has room for fewer regions than the pool has threads. With a slot per
    /// thread this is [`run_indexed`](Self::run_indexed); otherwise `slots` tasks each stride over
    /// the items, task `t` using slot `t`.
    pub fn run_slots(&self, n_items: usize, slots: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        if slots >= self.threads {
            return self.run_indexed(n_items, f);
        }
        let n_tasks = slots.max(1).min(n_items);
        self.run(n_tasks, &|t| {
            let mut i = t;
            while i < n_items {
                f(i, t);
                i += n_tasks;
            }
        })
    }

    /// Runs `f(task, worker)` for every `task in 0..n_tasks`; `worker < self.threads()` names the
    /// thread (0 = caller), so tasks may use per-worker scratch. If the pool is busy (a job from
    /// another thread, or a nested call from inside a task) the tasks run inline as worker 0.
    /// A panic in a task is re-raised on the caller after all tasks have finished.
    pub fn run_indexed(&self, n_tasks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.threads == 1 || n_tasks == 1 {
            for t in 0..n_tasks {
                f(t, 0);
            }
            return;
        }
        let _guard = match self.run_lock.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                for t in 0..n_tasks {
                    f(t, 0);
                }
                return;
            }
        };
        let sh = &*self.shared;
        // SAFETY: erase the closure's lifetime. The pointer is only dereferenced by workers that
        // registered for this epoch, and this function does not return before every such worker has
        // unregistered (see the wait on the registered count below).
        let erased: *const TaskFn<'static> =
            unsafe { std::mem::transmute::<&TaskFn<'_>, &TaskFn<'static>>(f) };
        // SAFETY: we hold run_lock and the state is CLOSED with zero registered workers (initial
        // state, or the end of the previous run), so no other thread reads the job slot now.
        unsafe {
            *sh.job.get() = Job {
                f: Some(erased),
                n_tasks,
            };
        }
        sh.next.store(0, Ordering::Relaxed);
        sh.panicked.store(false, Ordering::Relaxed);
        let watch = sh.watch.load(Ordering::Relaxed);
        // (Published to the workers with the epoch below.)
        sh.first_done.store(u64::MAX, Ordering::Relaxed);
        let epoch = (sh.state.load(Ordering::Relaxed) >> 32).wrapping_add(1) & 0xffff_ffff;
        sh.state.store(epoch << 32, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = sh.lock.lock().unwrap_or_else(|p| p.into_inner());
            sh.cv.notify_all();
        }
        // Work alongside the workers.
        let mut caller_panic = None;
        loop {
            let t = sh.next.fetch_add(1, Ordering::Relaxed);
            if t >= n_tasks {
                break;
            }
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(t, 0))) {
                caller_panic.get_or_insert(p);
            }
        }
        let caller_done = if watch { sh.now_ns() } else { 0 };
        // Every task index is claimed now, by us (finished) or by a registered worker. Close the
        // epoch and wait for the registered workers: when none is left, all tasks are done.
        sh.state.fetch_or(CLOSED, Ordering::SeqCst);
        let mut spins = 0u32;
        while sh.state.load(Ordering::Acquire) & COUNT_MASK != 0 {
            backoff(&mut spins);
        }
        if watch {
            // The workers' `first_done` came before their unregistering (Release), which the
            // load above acquired.
            let first = sh.first_done.load(Ordering::Relaxed).min(caller_done);
            sh.idle_ns.fetch_add(sh.now_ns().saturating_sub(first), Ordering::Relaxed);
        }
        // SAFETY: closed and no worker registered: nobody reads the slot; drop the dangling pointer.
        unsafe {
            (*sh.job.get()).f = None;
        }
        if let Some(p) = caller_panic {
            resume_unwind(p);
        }
        if sh.panicked.load(Ordering::Relaxed) {
            panic!("a ThreadPool task panicked on a worker thread");
        }
    }
}

#[inline]
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 1 << 12 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

fn worker_loop(sh: &Shared, w: usize) {
    let mut seen_epoch = 0u64;
    loop {
        // Wait for a new epoch: spin for `sh.spin`, then park.
        let mut start: Option<Instant> = None;
        let mut i = 0u32;
        loop {
            if sh.shutdown.load(Ordering::Acquire) {
                return;
            }
            let s = sh.state.load(Ordering::Acquire);
            if s >> 32 != seen_epoch && s & CLOSED == 0 {
                break;
            }
            i = i.wrapping_add(1);
            if !i.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let t0 = *start.get_or_insert(now);
            if now.duration_since(t0) < sh.spin {
                std::hint::spin_loop();
                continue;
            }
            let g = sh.lock.lock().unwrap_or_else(|p| p.into_inner());
            sh.sleepers.fetch_add(1, Ordering::SeqCst);
            let s = sh.state.load(Ordering::SeqCst);
            let g = if (s >> 32 == seen_epoch || s & CLOSED != 0)
                && !sh.shutdown.load(Ordering::SeqCst)
            {
                sh.cv.wait(g).unwrap_or_else(|p| p.into_inner())
            } else {
                g
            };
            sh.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(g);
            start = None;
        }
        // Register for the current epoch if it is still open.
        let mut s = sh.state.load(Ordering::Acquire);
        let registered = loop {
            if s & CLOSED != 0 {
                break false;
            }
            match sh
                .state
                .compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break true,
                Err(cur) => s = cur,
            }
        };
        seen_epoch = s >> 32;
        if !registered {
            continue;
        }
        // SAFETY: registered for an open epoch: the caller wrote the slot before publishing the
        // epoch (acquired by the CAS) and will not change it or return before we unregister.
        let (f, n_tasks) = unsafe {
            let job = &*sh.job.get();
            (job.f, job.n_tasks)
        };
        if let Some(f) = f {
            // SAFETY: see above: the closure outlives our registration.
            let f = unsafe { &*f };
            loop {
                let t = sh.next.fetch_add(1, Ordering::Relaxed);
                if t >= n_tasks {
                    break;
                }
                if catch_unwind(AssertUnwindSafe(|| f(t, w))).is_err() {
                    sh.panicked.store(true, Ordering::Relaxed);
                }
            }
        }
        if sh.watch.load(Ordering::Relaxed) {
            sh.first_done.fetch_min(sh.now_ns(), Ordering::Relaxed);
        }
        sh.state.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.cv.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// How many scratch regions of `per` floats a job on `pool` uses: one per thread, fewer when
/// `scratch_len` floats hold fewer; `ScratchTooSmall` when not even one fits (or `scratch` is null).
pub(crate) fn scratch_slots(
    scratch: *const f32,
    scratch_len: usize,
    per: usize,
    pool: Option<&ThreadPool>,
) -> Result<usize, crate::KernelError> {
    if scratch.is_null() || scratch_len < per {
        let got = if scratch.is_null() { 0 } else { scratch_len };
        return Err(crate::KernelError::ScratchTooSmall { needed: per, got });
    }
    Ok(pool.map_or(1, |p| p.threads()).min(scratch_len / per.max(1)).max(1))
}
