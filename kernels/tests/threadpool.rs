//! The persistent pool: every task runs exactly once, worker indices are in range, per-slot jobs
//! stay in their slots, back-to-back and nested calls work, several callers can share a pool, panics come back to the caller, and the pool
//! shuts down cleanly.

use kiln_kernels::threadpool::ThreadPool;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

fn counts(pool: &ThreadPool, n: usize) -> Vec<usize> {
    let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
    pool.run(n, &|t| {
        hits[t].fetch_add(1, Ordering::Relaxed);
    });
    hits.iter().map(|h| h.load(Ordering::Relaxed)).collect()
}

#[test]
fn each_task_runs_exactly_once() {
    for threads in [1, 2, 3, 8] {
        let pool = ThreadPool::new(threads);
        assert_eq!(pool.threads(), threads);
        for n in [0, 1, 2, 3, 7, 64, 1000] {
            assert_eq!(counts(&pool, n), vec![1; n], "threads {threads} n {n}");
        }
    }
}

#[test]
fn many_back_to_back_runs() {
    let pool = ThreadPool::new(2);
    let total = AtomicUsize::new(0);
    for i in 0..20_000 {
        pool.run(1 + i % 5, &|t| {
            total.fetch_add(t + 1, Ordering::Relaxed);
        });
    }
    let want: usize = (0..20_000).map(|i| (1..=1 + i % 5).sum::<usize>()).sum();
    assert_eq!(total.load(Ordering::Relaxed), want);
}

#[test]
fn runs_after_workers_parked() {
    // Short spin: workers park between runs, and must be woken.
    let pool = ThreadPool::with_spin(3, Duration::from_micros(1));
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(1));
        assert_eq!(counts(&pool, 9), vec![1; 9]);
    }
}

#[test]
fn worker_indices_are_in_range_and_used() {
    let pool = ThreadPool::new(3);
    let seen = Mutex::new(vec![0usize; 3]);
    for _ in 0..200 {
        pool.run_indexed(64, &|_t, w| {
            assert!(w < 3);
            seen.lock().unwrap()[w] += 1;
            std::hint::black_box((0..2000).sum::<usize>());
        });
    }
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.iter().sum::<usize>(), 200 * 64);
    assert!(seen[0] > 0, "the caller takes part");
}

#[test]
fn nested_run_executes_inline() {
    let pool = ThreadPool::new(2);
    let total = AtomicUsize::new(0);
    pool.run(4, &|_| {
        pool.run(3, &|_| {
            total.fetch_add(1, Ordering::Relaxed);
        });
    });
    assert_eq!(total.load(Ordering::Relaxed), 12);
}

#[test]
fn concurrent_callers_share_a_pool() {
    let pool = ThreadPool::new(2);
    let total = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..500 {
                    pool.run(5, &|_| {
                        total.fetch_add(1, Ordering::Relaxed);
                    });
                }
            });
        }
    });
    assert_eq!(total.load(Ordering::Relaxed), 4 * 500 * 5);
}

#[test]
fn panic_in_a_task_reaches_the_caller_and_pool_survives() {
    let pool = ThreadPool::new(2);
    for bad in [0usize, 5] {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(8, &|t| {
                if t == bad {
                    panic!("task {t} fails");
                }
            })
        }));
        assert!(r.is_err());
        assert_eq!(counts(&pool, 10), vec![1; 10]);
    }
}

#[test]
fn borrowed_data_is_safe_to_drop_after_run() {
    let pool = ThreadPool::new(2);
    for i in 0..1000 {
        let data = vec![i; 16];
        let sum = AtomicUsize::new(0);
        pool.run(16, &|t| {
            sum.fetch_add(data[t], Ordering::Relaxed);
        });
        drop(data);
        assert_eq!(sum.load(Ordering::Relaxed), 16 * i);
    }
}

#[test]
fn drop_joins_workers() {
    for _ in 0..20 {
        let pool = ThreadPool::new(4);
        assert_eq!(counts(&pool, 4), vec![1; 4]);
        drop(pool);
    }
}

/// `run_slots` (per-worker scratch with room for fewer regions than the pool has threads): every
/// item once, every slot below the count given, and no slot in use by two tasks at a time.
#[test]
fn run_slots_keeps_each_item_once_and_each_slot_to_one_task() {
    for threads in [1, 2, 4] {
        let pool = ThreadPool::new(threads);
        for (items, slots) in [(10, 2), (3, 8), (7, 4), (1, 1), (5, 0), (64, 3)] {
            let hits: Vec<AtomicUsize> = (0..items).map(|_| AtomicUsize::new(0)).collect();
            let busy: Vec<AtomicBool> = (0..threads.max(slots).max(1)).map(|_| AtomicBool::new(false)).collect();
            let (max_slot, overlaps) = (AtomicUsize::new(0), AtomicUsize::new(0));
            pool.run_slots(items, slots, &|i, s| {
                if busy[s].swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                hits[i].fetch_add(1, Ordering::Relaxed);
                max_slot.fetch_max(s, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(50));
                busy[s].store(false, Ordering::SeqCst);
            });
            let got: Vec<usize> = hits.iter().map(|h| h.load(Ordering::Relaxed)).collect();
            assert_eq!(got, vec![1; items], "{threads} threads, {items} items, {slots} slots");
            assert!(max_slot.load(Ordering::Relaxed) < slots.max(1), "{threads} threads, {slots} slots");
            assert_eq!(overlaps.load(Ordering::SeqCst), 0, "a slot shared at once: {threads} threads, {slots} slots");
        }
    }
}

#[test]
fn idle_time_is_the_wait_at_the_join_while_watched() {
    let pool = ThreadPool::new(2);
    // Two tasks that start together (each waits for the other), one sleeping 30 ms: the other
    // thread waits about that long at the join.
    let job = |pool: &ThreadPool| {
        let started = AtomicUsize::new(0);
        pool.run(2, &|t| {
            started.fetch_add(1, Ordering::SeqCst);
            let t0 = std::time::Instant::now();
            while started.load(Ordering::SeqCst) < 2 {
                assert!(t0.elapsed() < Duration::from_secs(5), "the second thread never took a task");
                std::hint::spin_loop();
            }
            if t == 0 {
                std::thread::sleep(Duration::from_millis(30));
            }
        });
    };
    job(&pool);
    assert_eq!(pool.idle_ns(), 0, "not counted unless watched");
    pool.watch_idle(true);
    job(&pool);
    let idle = pool.idle_ns();
    assert!((25_000_000..2_000_000_000).contains(&idle), "idle {idle} ns");
    pool.watch_idle(false);
    job(&pool);
    assert_eq!(pool.idle_ns(), idle, "not counted once unwatched");
}
