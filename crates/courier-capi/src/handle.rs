//! Generation-checked handles: what the C caller holds instead of a pointer.
//!
//! Every object the C ABI hands out (context, worker, endpoint, request, ...) lives in a
//! table of its kind, and the caller gets an opaque value that packs
//!
//! ```text
//!   bits 63..59  kind (1..=31, never 0: a handle is never NULL, and its top byte makes it
//!                a non-canonical address, so C code that dereferences one faults at once)
//!   bits 58..38  slot index in the kind's table (up to 2^21 live objects of one kind)
//!   bits 37..0   the slot's generation when the object was put there
//! ```
//!
//! Looking a handle up checks the kind, the index and the generation, and counts the
//! caller in on the slot (one atomic add; one subtract when the call is done): NULL, a value
//! of another kind, a destroyed handle (destroy-twice, use-after-destroy) and a stale
//! request all fail with `COURIER_ERR_INVALID_HANDLE` instead of touching freed memory.
//! Destroying marks the slot dead (later lookups fail at once); the object is dropped and
//! the slot freed, with a new generation, by whoever leaves it last: the destroy itself, or
//! a call still using it on another thread, or further up this thread's stack (a callback
//! that destroys the worker whose progress runs it). So a destroy racing a use is sound too.
//!
//! Cost on the hot path: two uncontended atomic operations on the handle's own slot per
//! call, never a table-wide lock; making and ending a handle also take the kind's free-list
//! lock (only operations that return a request make one).
//!
//! Slots live in chunks that are allocated on first need and never freed, so a lookup
//! never races a reallocation; memory is bounded by the most objects ever alive at once.
//! A generation takes 2^38 reuses of the same slot to wrap (free slots are reused oldest
//! first), so a stale handle aliasing a new object is out of practical reach.

use std::collections::VecDeque;
use std::ops::Deref;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use courier_core::{Error, Status};

const KIND_SHIFT: u32 = 59;
const INDEX_SHIFT: u32 = 38;
const INDEX_BITS: u32 = KIND_SHIFT - INDEX_SHIFT;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const GEN_MASK: u64 = (1 << INDEX_SHIFT) - 1;
/// Slots per chunk, and chunks per table (together: every index).
const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;
const CHUNKS: usize = 1 << (INDEX_BITS - CHUNK_BITS);
/// Live objects of one kind at most.
pub(crate) const CAPACITY: usize = 1 << INDEX_BITS;

// A slot's state word: generation, two flags, and how many calls are using the slot now.
//   bits 63..26  generation (38 bits, as in the handle)
//   bit  25      DEAD: destroyed, the object still there until its last user leaves
//   bit  24      EMPTY: no object (free, or being filled)
//   bits 23..0   users (calls inside a lookup's guard, and lookups about to fail)
const W_GEN_SHIFT: u32 = 26;
const W_DEAD: u64 = 1 << 25;
const W_EMPTY: u64 = 1 << 24;
const W_USERS: u64 = (1 << 24) - 1;

// A handle is a pointer-sized value holding 64 bits.
const _: () = assert!(
    usize::BITS == 64,
    "the C ABI's handles need 64-bit pointers"
);

fn w_gen(w: u64) -> u64 {
    w >> W_GEN_SHIFT
}

struct Slot<T> {
    word: AtomicU64,
    /// The object (from `Arc::into_raw`) while the slot is not EMPTY; NULL otherwise.
    obj: AtomicPtr<T>,
}

struct Free {
    /// Indices whose slot is empty, oldest first.
    slots: VecDeque<u32>,
    /// Indices below this have a slot (allocated chunks cover them).
    next: u32,
    /// Objects in the table (mirrored in `Table::live` for lock-free reads).
    live: usize,
}

/// The table of one kind of handle.
pub(crate) struct Table<T> {
    chunks: [AtomicPtr<Slot<T>>; CHUNKS],
    free: Mutex<Free>,
    live: AtomicUsize,
}

/// A kind of object the C ABI hands out.
pub(crate) trait Handle: Send + Sync + Sized + 'static {
    /// Its kind number (1..=31, one per type).
    const KIND: u64;
    /// What the documentation calls it ("worker", "endpoint", ...).
    const WHAT: &'static str;
    fn table() -> &'static Table<Self>;
}

/// Declare `$t` a handle of kind `$kind`, named `$what` in error sentences.
macro_rules! handle_kind {
    ($t:ty, $kind:expr, $what:expr) => {
        impl $crate::handle::Handle for $t {
            const KIND: u64 = $kind;
            const WHAT: &'static str = $what;
            fn table() -> &'static $crate::handle::Table<Self> {
                static TABLE: $crate::handle::Table<$t> = $crate::handle::Table::new();
                &TABLE
            }
        }
    };
}
pub(crate) use handle_kind;

/// The name of a kind, for "a worker handle, not an endpoint handle".
fn kind_name(kind: u64) -> &'static str {
    match kind {
        1 => "context",
        2 => "worker",
        3 => "endpoint",
        4 => "listener",
        5 => "connection request",
        6 => "memory",
        7 => "remote key",
        8 => "request",
        9 => "active-message descriptor",
        10 => "job",
        11 => "job world",
        12 => "semaphore",
        _ => "unknown",
    }
}

/// "a worker", "an endpoint".
fn article(what: &str) -> String {
    match what.chars().next() {
        Some('a' | 'e' | 'i' | 'o' | 'u') => format!("an {what}"),
        _ => format!("a {what}"),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<T> Table<T> {
    pub(crate) const fn new() -> Table<T> {
        Table {
            chunks: [const { AtomicPtr::new(ptr::null_mut()) }; CHUNKS],
            free: Mutex::new(Free {
                slots: VecDeque::new(),
                next: 0,
                live: 0,
            }),
            live: AtomicUsize::new(0),
        }
    }

    /// The slot at `index`, if its chunk exists.
    #[inline]
    fn slot(&self, index: usize) -> Option<&Slot<T>> {
        let chunk = self
            .chunks
            .get(index >> CHUNK_BITS)?
            .load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: a non-NULL chunk pointer was stored (Release, after the chunk was fully
        // built) by `alloc_index` from a leaked boxed slice of CHUNK slots that is never
        // freed; `index & (CHUNK - 1)` is within it; slots are only shared (`&`).
        Some(unsafe { &*chunk.add(index & (CHUNK - 1)) })
    }

    /// An empty slot's index, growing the table by a chunk when none is free.
    fn alloc_index(&self, f: &mut Free) -> Option<u32> {
        if let Some(i) = f.slots.pop_front() {
            return Some(i);
        }
        let i = f.next as usize;
        if i >= CAPACITY {
            return None;
        }
        if i & (CHUNK - 1) == 0 {
            let chunk: Box<[Slot<T>]> = (0..CHUNK)
                .map(|_| Slot {
                    word: AtomicU64::new((1 << W_GEN_SHIFT) | W_EMPTY),
                    obj: AtomicPtr::new(ptr::null_mut()),
                })
                .collect();
            let p = Box::leak(chunk).as_mut_ptr();
            self.chunks[i >> CHUNK_BITS].store(p, Ordering::Release);
        }
        f.next += 1;
        Some(i as u32)
    }

    /// How many objects of this kind are alive.
    pub(crate) fn count(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// Give back the slot at `index`, emptied and with its next generation.
    fn free_slot(&self, index: u32) {
        let mut f = lock(&self.free);
        f.slots.push_back(index);
        f.live -= 1;
        self.live.store(f.live, Ordering::Relaxed);
    }
}

fn pack(kind: u64, index: u32, generation: u64) -> usize {
    ((kind << KIND_SHIFT) | ((index as u64) << INDEX_SHIFT) | (generation & GEN_MASK)) as usize
}

/// Put `obj` in its kind's table; the handle to give the caller.
pub(crate) fn insert<T: Handle>(obj: T) -> Result<*mut T, Error> {
    insert_arc(Arc::new(obj))
}

/// `insert` for an object already shared with the library (a request).
pub(crate) fn insert_arc<T: Handle>(obj: Arc<T>) -> Result<*mut T, Error> {
    let t = T::table();
    let index = {
        let mut f = lock(&t.free);
        let i = t.alloc_index(&mut f);
        if i.is_some() {
            f.live += 1;
            t.live.store(f.live, Ordering::Relaxed);
        }
        i
    };
    let Some(index) = index else {
        return Err(Error::msg(
            Status::NoResource,
            format!(
                "too many live {} handles (at most {CAPACITY}); destroy some first",
                T::WHAT
            ),
        ));
    };
    let slot = t
        .slot(index as usize)
        .ok_or_else(|| Error::new(Status::NoResource, "handle table chunk missing"))?;
    // The slot is ours (from the free list) and EMPTY: lookups with stale handles may still
    // count themselves in and out of it meanwhile, so the flag is cleared keeping their count.
    slot.obj
        .store(Arc::into_raw(obj) as *mut T, Ordering::Relaxed);
    let w = slot.word.fetch_and(!W_EMPTY, Ordering::Release);
    Ok(pack(T::KIND, index, w_gen(w)) as *mut T)
}

/// A live object, borrowed for one call: its slot counts this use until the guard drops.
pub(crate) struct Guard<T: Handle> {
    slot: &'static Slot<T>,
    index: u32,
    obj: NonNull<T>,
}

impl<T: Handle> Deref for Guard<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the slot counts this guard as a user, so the object (from Arc::into_raw)
        // is not released until the guard drops (`leave`); it is only shared (`&`).
        unsafe { self.obj.as_ref() }
    }
}

impl<T: Handle> Guard<T> {
    /// Leave the slot now; the object if this was its last use after a destroy.
    pub(crate) fn finish(self) -> Option<Arc<T>> {
        let (slot, index) = (self.slot, self.index);
        std::mem::forget(self);
        leave(slot, index)
    }
}

impl<T: Handle> Drop for Guard<T> {
    fn drop(&mut self) {
        drop(leave(self.slot, self.index));
    }
}

/// Count one user out of `slot`; if it was the last user of a destroyed object, take the
/// object out, free the slot with the next generation, and return the object.
fn leave<T: Handle>(slot: &'static Slot<T>, index: u32) -> Option<Arc<T>> {
    let prev = slot.word.fetch_sub(1, Ordering::AcqRel);
    if prev & W_DEAD == 0 || prev & W_USERS != 1 {
        return None;
    }
    // Dead and nobody in it: the one whose compare-and-swap wins frees it (a stale lookup
    // may have counted itself in and out meanwhile; exactly one sees this word).
    let dead = prev - 1;
    let empty = (((w_gen(dead) + 1) & GEN_MASK) << W_GEN_SHIFT) | W_EMPTY;
    if slot
        .word
        .compare_exchange(dead, empty, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return None;
    }
    take_out(slot, index)
}

/// The object of a slot just made EMPTY by this thread's compare-and-swap; frees the slot.
fn take_out<T: Handle>(slot: &'static Slot<T>, index: u32) -> Option<Arc<T>> {
    let p = slot.obj.swap(ptr::null_mut(), Ordering::Acquire);
    T::table().free_slot(index);
    // SAFETY: `p` came from Arc::into_raw in `insert_arc`; the compare-and-swap that made
    // the slot EMPTY (only one can, from a word with no user left) makes this the only
    // place that takes it back, after every user left.
    (!p.is_null()).then(|| unsafe { Arc::from_raw(p) })
}

/// Where a handle's value points in its table, or why it points nowhere.
fn locate<T: Handle>(h: *const T, name: &str) -> Result<(&'static Slot<T>, u32, u64), Error> {
    let v = h as usize as u64;
    if v == 0 {
        return Err(bad(format!("handle `{name}` is NULL")));
    }
    let kind = v >> KIND_SHIFT;
    if kind != T::KIND {
        return Err(bad(match kind_name(kind) {
            "unknown" => format!(
                "handle `{name}` is not a handle Courier made (expected {} handle)",
                article(T::WHAT)
            ),
            k => format!(
                "handle `{name}` is {} handle, not {} handle",
                article(k),
                article(T::WHAT)
            ),
        }));
    }
    let index = ((v >> INDEX_SHIFT) & INDEX_MASK) as u32;
    match T::table().slot(index as usize) {
        Some(s) => Ok((s, index, v & GEN_MASK)),
        None => Err(stale::<T>(name)),
    }
}

#[cold]
#[inline(never)]
fn bad(text: String) -> Error {
    Error::msg(Status::InvalidHandle, text)
}

#[cold]
#[inline(never)]
fn stale<T: Handle>(name: &str) -> Error {
    bad(format!(
        "{} handle `{name}` was destroyed (or released, or never made by Courier)",
        T::WHAT
    ))
}

/// The live object behind `h` for the length of a call, or `COURIER_ERR_INVALID_HANDLE`
/// with the reason.
#[inline]
pub(crate) fn get<T: Handle>(h: *const T, name: &str) -> Result<Guard<T>, Error> {
    let (slot, index, generation) = locate(h, name)?;
    let w = slot.word.fetch_add(1, Ordering::Acquire);
    if w & (W_DEAD | W_EMPTY) == 0 && w_gen(w) == generation {
        let p = slot.obj.load(Ordering::Acquire);
        if let Some(obj) = NonNull::new(p) {
            return Ok(Guard { slot, index, obj });
        }
    }
    drop(leave(slot, index));
    Err(stale::<T>(name))
}

/// A destroyed object, still reachable by the call that destroyed it.
pub(crate) enum Removed<T: Handle> {
    /// Nobody else was using it: it is out of the table, and this is the last reference
    /// the table had.
    Last(Arc<T>),
    /// Another call still uses it: it goes when the last of them ends.
    Shared(Guard<T>),
}

impl<T: Handle> Deref for Removed<T> {
    type Target = T;
    fn deref(&self) -> &T {
        match self {
            Removed::Last(a) => a,
            Removed::Shared(g) => g,
        }
    }
}

impl<T: Handle> Removed<T> {
    /// The object, if no other call still uses it.
    pub(crate) fn finish(self) -> Option<Arc<T>> {
        match self {
            Removed::Last(a) => Some(a),
            Removed::Shared(g) => g.finish(),
        }
    }
}

/// Destroy the object behind `h`, if `allow` agrees: the handle is dead from now on. The
/// result still reaches the object; when it drops (or `finish`es) the object goes too,
/// unless another call is still using it (then it goes when that call ends).
pub(crate) fn remove_if<T: Handle>(
    h: *const T,
    name: &str,
    allow: impl FnOnce(&T) -> Result<(), Error>,
) -> Result<Removed<T>, Error> {
    let g = get(h, name)?;
    allow(&g)?;
    let mut w = g.slot.word.load(Ordering::Relaxed);
    loop {
        if w & (W_DEAD | W_EMPTY) != 0 {
            // Another thread destroyed it first.
            return Err(stale::<T>(name));
        }
        // Only this call uses it (the common case): empty the slot at once; otherwise
        // mark it dead for the last user to empty.
        let only_us = w & W_USERS == 1;
        let next = if only_us {
            (((w_gen(w) + 1) & GEN_MASK) << W_GEN_SHIFT) | W_EMPTY
        } else {
            w | W_DEAD
        };
        match g
            .slot
            .word
            .compare_exchange_weak(w, next, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) if only_us => {
                let (slot, index) = (g.slot, g.index);
                // Counted out by the swap above.
                std::mem::forget(g);
                return take_out(slot, index)
                    .map(Removed::Last)
                    .ok_or_else(|| stale::<T>(name));
            }
            Ok(_) => return Ok(Removed::Shared(g)),
            Err(now) => w = now,
        }
    }
}

/// `remove_if` with no condition.
pub(crate) fn remove<T: Handle>(h: *const T, name: &str) -> Result<Removed<T>, Error> {
    remove_if(h, name, |_| Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Thing(u32);
    handle_kind!(Thing, 30, "test thing");
    struct Other;
    handle_kind!(Other, 31, "other thing");

    #[test]
    fn handles_are_checked_by_kind_index_and_generation() {
        let a = insert(Thing(7)).unwrap();
        assert_eq!(get(a, "a").unwrap().0, 7);
        // Never NULL, never a canonical address.
        assert!(a as usize >> 56 != 0);
        // Another kind's handle is refused.
        let o = insert(Other).unwrap();
        let e = get(o as *const Thing, "o").err().unwrap();
        assert_eq!(e.status(), Status::InvalidHandle);
        assert!(
            e.detail().contains("expected a test thing handle"),
            "{}",
            e.detail()
        );
        // NULL and garbage.
        assert_eq!(
            get::<Thing>(std::ptr::null(), "n").err().unwrap().status(),
            Status::InvalidHandle
        );
        assert_eq!(
            get(0x1234usize as *const Thing, "g")
                .err()
                .unwrap()
                .status(),
            Status::InvalidHandle
        );
        // Destroyed: the handle and a second destroy are refused; a new object in the same
        // slot is not reachable through the old handle.
        let held = get(a, "a").unwrap();
        assert_eq!(remove(a, "a").unwrap().0, 7);
        assert_eq!(held.0, 7, "a use in flight keeps the object alive");
        assert_eq!(get(a, "a").err().unwrap().status(), Status::InvalidHandle);
        assert_eq!(
            remove(a, "a").err().unwrap().status(),
            Status::InvalidHandle
        );
        let b: Vec<_> = (0..3).map(|i| insert(Thing(100 + i)).unwrap()).collect();
        assert!(!b.contains(&a));
        assert_eq!(get(a, "a").err().unwrap().status(), Status::InvalidHandle);
        for (i, h) in b.iter().enumerate() {
            assert_eq!(get(*h, "b").unwrap().0, 100 + i as u32);
        }
        // A refused removal leaves the handle alive.
        let e = remove_if(b[0], "b", |_| Err(Error::new(Status::InvalidParam, "no")));
        assert_eq!(e.err().unwrap().status(), Status::InvalidParam);
        assert!(get(b[0], "b").is_ok());
        for h in b {
            remove(h, "b").unwrap();
        }
        remove(o, "o").unwrap();
    }

    static DROPS: AtomicUsize = AtomicUsize::new(0);
    struct Counted(u64);
    impl Drop for Counted {
        fn drop(&mut self) {
            DROPS.fetch_add(1, Ordering::SeqCst);
        }
    }
    handle_kind!(Counted, 29, "counted thing");

    #[test]
    fn a_destroy_inside_a_use_waits_for_it_and_the_slot_comes_back_new() {
        let h = insert(Counted(5)).unwrap();
        let outer = get(h, "h").unwrap();
        // A callback under `outer` destroys the object: the handle dies at once, the object
        // stays until `outer` is done, then goes exactly once.
        assert!(remove(h, "h").unwrap().finish().is_none());
        assert_eq!(get(h, "h").err().unwrap().status(), Status::InvalidHandle);
        assert_eq!(outer.0, 5);
        assert_eq!(DROPS.load(Ordering::SeqCst), 0);
        drop(outer);
        assert_eq!(DROPS.load(Ordering::SeqCst), 1);
        assert_eq!(Counted::table().count(), 0);
        // The only free slot is reused, with a new generation: same index, other handle.
        let again = insert(Counted(6)).unwrap();
        let index = |h: *mut Counted| (h as usize as u64 >> INDEX_SHIFT) & INDEX_MASK;
        assert_eq!(index(again), index(h));
        assert_ne!(again, h);
        assert_eq!(get(h, "h").err().unwrap().status(), Status::InvalidHandle);
        assert_eq!(get(again, "again").unwrap().0, 6);
        // Alone, the destroy gets the object back.
        let last = remove(again, "again").unwrap().finish().unwrap();
        assert_eq!(last.0, 6);
        drop(last);
        assert_eq!(DROPS.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn lookups_from_many_threads_race_a_destroy_soundly() {
        let h = insert(Thing(1)).unwrap() as usize;
        let users: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut ok = 0u32;
                    for _ in 0..10_000 {
                        match get(h as *const Thing, "h") {
                            Ok(t) => {
                                assert_eq!(t.0, 1);
                                ok += 1;
                            }
                            Err(e) => assert_eq!(e.status(), Status::InvalidHandle),
                        }
                    }
                    ok
                })
            })
            .collect();
        remove(h as *const Thing, "h").unwrap();
        for u in users {
            u.join().unwrap();
        }
        assert!(get(h as *const Thing, "h").is_err());
    }
}
