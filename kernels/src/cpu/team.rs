//! A team of threads that stay awake through a decode pass: the parallel regions of one token.
//!
//! A decode token makes about a hundred parallel regions of a few to a few hundred
//! microseconds each (the products, attention). Rayon's idle workers yield a few dozen times
//! and then sleep on a futex, and waking a sleeping thread in a virtual machine costs tens of
//! microseconds, which is more than the whole slack a region has at the memory's bandwidth.
//! So, as ggml's threads do, the team's helpers spin (with `pause`) between regions. A pass
//! holds an [`Awake`] guard: while one is held they spin through gaps of up to [`PASS_SPIN`],
//! and when the last is dropped they park at once, so that between steps they leave the
//! cores to the threads that serve the step's results (on a 2-core machine, a spinning
//! helper there adds its spin to every token's latency). Without a guard (a caller making
//! products of its own) they park after [`SPIN`] without a region. Between two looks at the
//! clock a spinning helper yields its core, which costs a system call when no other thread
//! waits for it and hands it over when one does (more processes than cores, as under a test
//! runner, or a router sharing the machine).
//!
//! A region is `work(i)` for `i` in `0..items`. The calling thread is member 0: it publishes
//! the region (the work and a new odd epoch), unparks helpers that sleep, and takes items
//! from a shared counter like every member, so a late or descheduled member costs one item
//! of imbalance at most. It returns once every item is done and no helper still holds the
//! region's work. Which member runs an item never changes what the item computes, so
//! results are the same bits with or without the team.
//!
//! There is one team per process, of as many members as rayon's global pool has threads. A
//! call while another thread holds the team, from inside a pool of another size, or while
//! the team is switched off ([`set_enabled`], or `TESSERA_DECODE_TEAM=off` in the
//! environment) runs on rayon's pool instead.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock, TryLockError};
use std::thread::Thread;
use std::time::{Duration, Instant};

use rayon::prelude::*;

/// How long a helper spins without a region before it parks, outside passes.
const SPIN: Duration = Duration::from_micros(300);

/// How long a helper spins without a region before it parks, during a pass (whose serial
/// stretches are far shorter).
const PASS_SPIN: Duration = Duration::from_millis(2);

/// Spins between two looks at the clock.
const SPINS_PER_CLOCK: u32 = 64;

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Switches the team on or off for the whole process (off: every region runs on rayon's
/// pool); for benchmarks that compare the two in one process.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, SeqCst);
}

/// Runs `work(i)` for every `i` in `0..items`, spread over the team (see the module
/// documentation). `work` must not wait for other threads.
pub fn run(items: usize, work: &(dyn Fn(usize) + Sync)) {
    match items {
        0 => {}
        1 => work(0),
        _ => match team().and_then(|t| t.try_lock()) {
            Some(guard) => guard.run(items, work),
            None => (0..items).into_par_iter().with_max_len(1).for_each(work),
        },
    }
}

/// `f(i)` for every `i` in `0..items`, computed as [`run`] does, in order.
pub fn map<T: Send>(items: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let mut out: Vec<Option<T>> = (0..items).map(|_| None).collect();
    let slots = Slots(out.as_mut_ptr());
    run(items, &|i| {
        // SAFETY: `run` calls this once per `i < items`, so each slot is written by one
        // thread only, inside `out`, which outlives `run`.
        unsafe { *slots.get().add(i) = Some(f(i)) }
    });
    out.into_iter()
        .map(|v| v.expect("run computes every item"))
        .collect()
}

/// Keeps the helpers spinning between regions until dropped (see the module documentation);
/// taking it wakes parked helpers, so that they are spinning by the first region.
#[must_use = "the helpers park as soon as it is dropped"]
pub struct Awake {
    shared: Option<&'static Shared>,
}

/// Holds the team awake for a pass.
pub fn awake() -> Awake {
    let shared = team().map(|t| t.shared);
    if let Some(s) = shared {
        s.awake.fetch_add(1, SeqCst);
        s.wake_sleepers();
    }
    Awake { shared }
}

impl Drop for Awake {
    fn drop(&mut self) {
        if let Some(s) = self.shared
            && s.awake.fetch_sub(1, SeqCst) == 1
        {
            s.rest.fetch_add(1, SeqCst);
        }
    }
}

/// The output slots of [`map`], shared across the team.
struct Slots<T>(*mut Option<T>);
// SAFETY: each slot is written by one thread only (see `map`).
unsafe impl<T: Send> Sync for Slots<T> {}

impl<T> Slots<T> {
    /// The pointer (a method, so that closures capture the whole `Sync` wrapper).
    fn get(&self) -> *mut Option<T> {
        self.0
    }
}

/// The process's team, started on first use; `None` with a single thread or when switched
/// off.
fn team() -> Option<&'static Team> {
    static TEAM: OnceLock<Option<Team>> = OnceLock::new();
    if !ENABLED.load(SeqCst) {
        return None;
    }
    let team = TEAM
        .get_or_init(|| {
            let off = std::env::var("TESSERA_DECODE_TEAM").is_ok_and(|v| v == "off");
            if off { None } else { Team::start() }
        })
        .as_ref()?;
    (rayon::current_num_threads() == team.members).then_some(team)
}

/// The published region: what helpers run.
#[derive(Clone, Copy)]
struct Region {
    work: *const (dyn Fn(usize) + Sync),
    items: usize,
}

/// State shared by the caller and the helpers.
struct Shared {
    /// Odd while a region is open; every change wakes spinning helpers.
    epoch: AtomicUsize,
    /// Written by the caller while the epoch is even and no helper is active.
    region: UnsafeCell<Region>,
    /// The next item to take.
    next: AtomicUsize,
    /// Items finished.
    done: AtomicUsize,
    /// Helpers inside the current region (holding its `work`).
    active: AtomicUsize,
    /// Whether an item of the current region panicked on a helper.
    panicked: AtomicBool,
    /// [`Awake`] guards held.
    awake: AtomicUsize,
    /// Bumped when the last guard is dropped: helpers park at once.
    rest: AtomicUsize,
    /// Each helper's parked flag and handle.
    sleepers: Vec<(AtomicBool, OnceLock<Thread>)>,
}

// SAFETY: `region` is written only by the thread that holds the team's lock, while no helper
// reads it (the epoch is even and `active` is zero), and read only by helpers inside a region.
// `work` points to a `Sync` closure that outlives the region (the caller returns only once
// `active` is zero).
unsafe impl Sync for Shared {}
// SAFETY: as above.
unsafe impl Send for Shared {}

struct Team {
    members: usize,
    shared: &'static Shared,
    owner: Mutex<()>,
}

/// The team, held by one caller.
struct Guard<'a> {
    team: &'a Team,
    _owner: std::sync::MutexGuard<'a, ()>,
}

impl Team {
    fn start() -> Option<Team> {
        // Outside any pool, rayon reports its global pool's size.
        let members = std::thread::spawn(rayon::current_num_threads)
            .join()
            .unwrap_or(1);
        if members < 2 {
            return None;
        }
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            epoch: AtomicUsize::new(0),
            region: UnsafeCell::new(Region {
                work: &|_| {},
                items: 0,
            }),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            awake: AtomicUsize::new(0),
            rest: AtomicUsize::new(0),
            sleepers: (1..members)
                .map(|_| (AtomicBool::new(false), OnceLock::new()))
                .collect(),
        }));
        for id in 1..members {
            let spawned = std::thread::Builder::new()
                .name(format!("tessera-team-{id}"))
                .spawn(move || helper(shared, id - 1));
            let Ok(handle) = spawned else {
                // Without all its helpers the team would still be correct, but slower than
                // rayon's pool; leave the work to the pool.
                return None;
            };
            let _ = shared.sleepers[id - 1].1.set(handle.thread().clone());
        }
        Some(Team {
            members,
            shared,
            owner: Mutex::new(()),
        })
    }

    fn try_lock(&self) -> Option<Guard<'_>> {
        match self.owner.try_lock() {
            Ok(owner) => Some(Guard {
                team: self,
                _owner: owner,
            }),
            Err(TryLockError::Poisoned(p)) => Some(Guard {
                team: self,
                _owner: p.into_inner(),
            }),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

impl Guard<'_> {
    fn run(&self, items: usize, work: &(dyn Fn(usize) + Sync)) {
        let s = self.team.shared;
        // SAFETY: the epoch is even and no helper is active (the previous region waited for
        // that), so no helper reads `region`. The lifetime is erased for the helpers, which
        // stop using `work` before this call returns.
        unsafe {
            let work: *const (dyn Fn(usize) + Sync + '_) = work;
            *s.region.get() = Region {
                work: std::mem::transmute::<
                    *const (dyn Fn(usize) + Sync + '_),
                    *const (dyn Fn(usize) + Sync + 'static),
                >(work),
                items,
            };
        }
        s.next.store(0, SeqCst);
        s.done.store(0, SeqCst);
        s.panicked.store(false, SeqCst);
        let open = s.epoch.fetch_add(1, SeqCst) + 1;
        assert!(open % 2 == 1);
        s.wake_sleepers();
        s.take_items(items, work);
        while s.done.load(SeqCst) < items {
            std::hint::spin_loop();
        }
        s.epoch.store(open + 1, SeqCst);
        while s.active.load(SeqCst) > 0 {
            std::hint::spin_loop();
        }
        if s.panicked.load(SeqCst) {
            panic!("an item of a parallel region panicked (its message is above)");
        }
    }
}

impl Shared {
    /// Takes and runs items until none is left. An item that panics is counted as done (its
    /// message went to the panic hook) and the region goes on, so that it still ends.
    fn take_items(&self, items: usize, work: &(dyn Fn(usize) + Sync)) {
        loop {
            let i = self.next.fetch_add(1, SeqCst);
            if i >= items {
                return;
            }
            if catch_unwind(AssertUnwindSafe(|| work(i))).is_err() {
                self.panicked.store(true, SeqCst);
            }
            self.done.fetch_add(1, SeqCst);
        }
    }

    fn wake_sleepers(&self) {
        for (asleep, thread) in &self.sleepers {
            if asleep.load(SeqCst)
                && let Some(t) = thread.get()
            {
                t.unpark();
            }
        }
    }
}

/// A helper's life: wait for a region (spinning, then parked), join it, take items.
fn helper(s: &'static Shared, slot: usize) {
    let mut seen = s.epoch.load(SeqCst);
    loop {
        let epoch = wait_for_change(s, slot, seen);
        seen = epoch;
        if epoch.is_multiple_of(2) {
            continue;
        }
        s.active.fetch_add(1, SeqCst);
        if s.epoch.load(SeqCst) == epoch {
            // SAFETY: the region is open and this helper is counted in `active`, so the
            // caller neither rewrites `region` nor returns (freeing `work`) until it leaves.
            let region = unsafe { *s.region.get() };
            let work = unsafe { &*region.work };
            s.take_items(region.items, work);
        }
        s.active.fetch_sub(1, SeqCst);
    }
}

/// Waits until the epoch differs from `seen`: spins (see the module documentation), then
/// parks until woken.
fn wait_for_change(s: &Shared, slot: usize, seen: usize) -> usize {
    let mut since = Instant::now();
    let mut rest = s.rest.load(SeqCst);
    loop {
        for _ in 0..SPINS_PER_CLOCK {
            let epoch = s.epoch.load(SeqCst);
            if epoch != seen {
                return epoch;
            }
            std::hint::spin_loop();
        }
        std::thread::yield_now();
        let rested = s.rest.load(SeqCst) != rest;
        let window = if s.awake.load(SeqCst) > 0 {
            PASS_SPIN
        } else {
            SPIN
        };
        if !rested && since.elapsed() < window {
            continue;
        }
        let asleep = &s.sleepers[slot].0;
        asleep.store(true, SeqCst);
        if s.epoch.load(SeqCst) == seen {
            std::thread::park();
        }
        asleep.store(false, SeqCst);
        // Woken (or spuriously): spin afresh, since a region usually follows a wake.
        since = Instant::now();
        rest = s.rest.load(SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_item_runs_once() {
        for items in [0, 1, 2, 3, 17, 1000] {
            let hits: Vec<AtomicU64> = (0..items).map(|_| AtomicU64::new(0)).collect();
            run(items, &|i| {
                hits[i].fetch_add(1, SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "{items} items");
        }
    }

    #[test]
    fn map_keeps_the_order() {
        for round in 0..200 {
            let got = map(round % 37, |i| i * i + round);
            let want: Vec<usize> = (0..round % 37).map(|i| i * i + round).collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn regions_after_helpers_parked_still_finish() {
        for _ in 0..3 {
            std::thread::sleep(SPIN * 4);
            let sum = AtomicU64::new(0);
            run(64, &|i| {
                sum.fetch_add(i as u64, SeqCst);
            });
            assert_eq!(sum.load(SeqCst), 64 * 63 / 2);
        }
    }

    #[test]
    fn concurrent_callers_share_the_team_or_fall_back() {
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                scope.spawn(move || {
                    for round in 0..100u64 {
                        let sum = AtomicU64::new(0);
                        run(33, &|i| {
                            sum.fetch_add(i as u64 * t + round, SeqCst);
                        });
                        assert_eq!(sum.load(SeqCst), (33 * 32 / 2) * t + 33 * round);
                    }
                });
            }
        });
    }

    #[test]
    fn regions_under_a_guard_and_after_it_finish() {
        for round in 0..50u64 {
            let awake = awake();
            let sum = AtomicU64::new(0);
            run(40, &|i| {
                sum.fetch_add(i as u64 + round, SeqCst);
            });
            drop(awake);
            assert_eq!(sum.load(SeqCst), 40 * 39 / 2 + 40 * round);
        }
    }

    #[test]
    fn a_panicking_item_panics_the_caller_and_leaves_the_team_usable() {
        let result = catch_unwind(|| {
            run(50, &|i| {
                if i == 31 {
                    panic!("item 31");
                }
            })
        });
        assert!(result.is_err());
        let count = AtomicU64::new(0);
        run(50, &|_| {
            count.fetch_add(1, SeqCst);
        });
        assert_eq!(count.load(SeqCst), 50);
    }
}
