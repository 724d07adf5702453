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
//! Looking a handle up checks the kind, the index, and the generation under the slot's own
//! lock, and returns a counted reference (`Arc`) to the object: NULL, a value of another
//! kind, a destroyed handle (destroy-twice, use-after-destroy) and a stale request all fail
//! with `COURIER_ERR_INVALID_HANDLE` instead of touching freed memory. Destroying takes the
//! object out of its slot and bumps the generation; the object itself is dropped when the
//! last call still using it (another thread's) returns, so a destroy racing a use is sound
//! too.
//!
//! Cost on the hot path: a lookup is a read lock of one slot (its own cache line in
//! practice, never a table-wide lock) and an `Arc` clone; making and ending a handle take
//! the kind's free-list lock (only operations that return a request make one).
//!
//! Slots live in chunks that are allocated on first need and never freed, so a lookup
//! never races a reallocation; memory is bounded by the most objects ever alive at once.
//! A generation takes 2^38 reuses of the same slot to wrap (free slots are reused oldest
//! first), so a stale handle aliasing a new object is out of practical reach.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

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

// A handle is a pointer-sized value holding 64 bits.
const _: () = assert!(
    usize::BITS == 64,
    "the C ABI's handles need 64-bit pointers"
);

struct SlotState<T> {
    /// The generation of the object in the slot, or of the next one to go there.
    generation: u64,
    obj: Option<Arc<T>>,
}

struct Slot<T> {
    state: RwLock<SlotState<T>>,
}

struct Free {
    /// Indices whose slot is empty, oldest first.
    slots: VecDeque<u32>,
    /// Indices below this have a slot (allocated chunks cover them).
    next: u32,
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
            chunks: [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS],
            free: Mutex::new(Free {
                slots: VecDeque::new(),
                next: 0,
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
                    state: RwLock::new(SlotState {
                        generation: 1,
                        obj: None,
                    }),
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
        t.alloc_index(&mut f)
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
    let mut s = slot.state.write().unwrap_or_else(|p| p.into_inner());
    s.obj = Some(obj);
    let generation = s.generation;
    drop(s);
    t.live.fetch_add(1, Ordering::Relaxed);
    Ok(pack(T::KIND, index, generation) as *mut T)
}

/// Where a handle's value points in its table, or why it points nowhere.
fn locate<T: Handle>(h: *const T, name: &str) -> Result<(&'static Slot<T>, u64), Error> {
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
    let index = ((v >> INDEX_SHIFT) & INDEX_MASK) as usize;
    match T::table().slot(index) {
        Some(s) => Ok((s, v & GEN_MASK)),
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

/// The live object behind `h`, or `COURIER_ERR_INVALID_HANDLE` with the reason.
#[inline]
pub(crate) fn get<T: Handle>(h: *const T, name: &str) -> Result<Arc<T>, Error> {
    let (slot, generation) = locate(h, name)?;
    let s = slot.state.read().unwrap_or_else(|p| p.into_inner());
    match &s.obj {
        Some(o) if s.generation & GEN_MASK == generation => Ok(o.clone()),
        _ => Err(stale::<T>(name)),
    }
}

/// Take the object behind `h` out of its table (the handle is dead from now on), if
/// `allow` agrees; the caller drops it (or the last call still using it does).
pub(crate) fn remove_if<T: Handle>(
    h: *const T,
    name: &str,
    allow: impl FnOnce(&T) -> Result<(), Error>,
) -> Result<Arc<T>, Error> {
    let (slot, generation) = locate(h, name)?;
    let obj = {
        let mut s = slot.state.write().unwrap_or_else(|p| p.into_inner());
        match &s.obj {
            Some(o) if s.generation & GEN_MASK == generation => allow(o)?,
            _ => return Err(stale::<T>(name)),
        }
        s.generation = s.generation.wrapping_add(1) & GEN_MASK;
        s.obj.take()
    };
    let t = T::table();
    let index = ((h as usize as u64 >> INDEX_SHIFT) & INDEX_MASK) as u32;
    lock(&t.free).slots.push_back(index);
    t.live.fetch_sub(1, Ordering::Relaxed);
    obj.ok_or_else(|| stale::<T>(name))
}

/// `remove_if` with no condition.
pub(crate) fn remove<T: Handle>(h: *const T, name: &str) -> Result<Arc<T>, Error> {
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
