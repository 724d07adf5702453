//! Symmetric memory: the heap segment and the program's data segment, what each PE
//! publishes about them, and where a local symmetric address lies on a peer.
//!
//! Both segments are addressed by offset: PE `p`'s copy of a symmetric object at offset
//! `o` of segment `s` is at `p`'s base of `s` plus `o` (bases differ between processes:
//! ASLR, and the heap is mapped wherever the kernel puts it).
//!
//! The data segment is the executable's writable ELF load segment after its RELRO part
//! (`.data` and `.bss`: global and static variables), found with `dl_iterate_phdr`. It is
//! moved in place into a shared segment (`MemMapParams::share_in_place`), so same-host
//! peers reach globals exactly as they reach the heap: loads, stores, CPU atomics.

use courier::{Context, Endpoint, MemMapParams, Memory, RemoteKey};

pub use crate::record::{Published, emit, parse};

/// One of the two symmetric segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seg {
    /// The symmetric heap (`shmem_malloc`).
    Heap = 0,
    /// Global and static variables.
    Data = 1,
}

impl Seg {
    /// A name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Seg::Heap => "symmetric heap",
            Seg::Data => "data segment",
        }
    }
}

/// A segment of this PE.
pub struct Local {
    /// Where it starts here.
    pub base: usize,
    /// Its length.
    pub len: usize,
    /// Its Courier mapping.
    pub mem: Memory,
}

impl Local {
    /// The offset in `mem` of offset `off` of the segment.
    pub fn mem_offset(&self, off: usize) -> usize {
        self.base - self.mem.as_ptr() as usize + off
    }

    /// Whether `[addr, addr + len)` lies inside; its offset if so.
    #[inline(always)]
    pub fn offset(&self, addr: usize, len: usize) -> Option<usize> {
        let off = addr.wrapping_sub(self.base);
        (off < self.len && len <= self.len - off).then_some(off)
    }
}

/// A segment of a peer, as reached from here.
pub struct Part {
    /// Its start in the peer's process.
    pub base: u64,
    /// Its length.
    pub len: u64,
    /// Its key, unpacked on the endpoint to the peer.
    pub key: RemoteKey,
    /// Where the whole segment is mapped here (a same-host peer), or null.
    pub direct: *mut u8,
}

/// A peer PE: its endpoint and segments.
pub struct Peer {
    /// The endpoint to it.
    pub ep: Endpoint,
    /// Its heap and (if it has one) data segment, indexed by `Seg`.
    pub parts: [Option<Part>; 2],
    /// Set when an operation goes to it through its worker (not directly): what `quiet`
    /// must wait for. Cleared by `quiet`.
    pub sent: std::sync::atomic::AtomicBool,
}

// SAFETY: `direct` points into mappings the keys keep alive; all access through it is by
// raw copies and atomics, as in Courier's own direct paths.
unsafe impl Send for Peer {}
// SAFETY: as above.
unsafe impl Sync for Peer {}

/// What a PE publishes: for each segment its base, length and packed key (length 0 and
/// no key for a missing data segment), and its host.
pub fn publish(heap: &Local, data: Option<&Local>) -> Result<Vec<u8>, String> {
    let key = |s: &Local| s.mem.pack_rkey().map_err(|e| format!("packing a key: {e}"));
    let heap_key = key(heap)?;
    let data_key = data.map(key).transpose()?;
    let data_seg = match (data, &data_key) {
        (Some(d), Some(k)) => (d.base as u64, d.len as u64, &k[..]),
        _ => (0, 0, &[][..]),
    };
    Ok(emit(&Published {
        host: courier::host_id(),
        segs: [(heap.base as u64, heap.len as u64, &heap_key[..]), data_seg],
    }))
}

/// Unpack a peer's published segments on `ep`.
pub fn connect(ep: Endpoint, blob: &[u8]) -> Result<Peer, String> {
    let p = parse(blob)?;
    let mut parts = [None, None];
    for (i, (base, len, key)) in p.segs.iter().enumerate() {
        if *len == 0 {
            continue;
        }
        let name = [Seg::Heap, Seg::Data][i].name();
        let key = ep
            .rkey_unpack(key)
            .map_err(|e| format!("its {name} key: {e}"))?;
        // Accesses are checked against the published length, and a mapped segment is
        // then reached by plain loads and stores: that length must lie inside the key.
        if !within(*base, *len, key.bounds()) {
            let (kb, kl) = key.bounds();
            return Err(format!(
                "its {name} [{base:#x}, +{len}) lies outside its key's region [{kb:#x}, +{kl})"
            ));
        }
        let direct = key.direct_ptr(*base).unwrap_or(std::ptr::null_mut());
        parts[i] = Some(Part {
            base: *base,
            len: *len,
            key,
            direct,
        });
    }
    Ok(Peer {
        ep,
        parts,
        sent: std::sync::atomic::AtomicBool::new(false),
    })
}

/// Whether `[base, base + len)` lies inside the region `(start, length)`.
fn within(base: u64, len: u64, (start, length): (u64, u64)) -> bool {
    base >= start
        && base
            .checked_add(len)
            .zip(start.checked_add(length))
            .is_some_and(|(end, region_end)| end <= region_end)
}

/// The executable's data and bss, page-aligned: `(start, len)`, or `None` when there is
/// no writable segment after RELRO.
pub fn data_range() -> Option<(usize, usize)> {
    struct Found {
        range: Option<(usize, usize)>,
        first: bool,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `Found` passed below; `info` is valid during the callback.
        let (found, info) = unsafe { (&mut *(data as *mut Found), &*info) };
        if !found.first {
            return 1;
        }
        found.first = false; // the first object is the executable
        // SAFETY: dlpi_phdr points at dlpi_phnum headers.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let base = info.dlpi_addr as usize;
        let relro_end = phdrs
            .iter()
            .filter(|p| p.p_type == libc::PT_GNU_RELRO)
            .map(|p| base + (p.p_vaddr + p.p_memsz) as usize)
            .max()
            .unwrap_or(0);
        let page = rustix::param::page_size();
        for p in phdrs {
            if p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_W != 0 {
                let start = base + p.p_vaddr as usize;
                let end = start + p.p_memsz as usize;
                let s = start.max(relro_end);
                let s = s & !(page - 1);
                let s = if s < relro_end { s + page } else { s };
                let e = (end + page - 1) & !(page - 1);
                if e > s {
                    found.range = Some((s, e - s));
                }
            }
        }
        1
    }
    let mut found = Found {
        range: None,
        first: true,
    };
    // SAFETY: the callback only reads the headers and writes `found`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut found as *mut Found as *mut libc::c_void) };
    found.range
}

/// Share the data segment in place and map it in Courier; `None` when the executable has
/// none, or when it cannot be moved (then globals are not symmetric, and saying so).
pub fn share_data(ctx: &Context) -> Option<Local> {
    let (base, len) = data_range()?;
    // SAFETY: the executable's data segment: whole private pages that stay mapped for the
    // life of the process; shmem_init runs this before the program starts threads that
    // touch globals, and OpenSHMEM programs reach symmetric globals only as the standard
    // allows (their remote accesses are ordered by the program's own synchronisation).
    let params = unsafe { MemMapParams::share_in_place(base as *mut u8, len) };
    match ctx.mem_map(params) {
        Ok(mem) => {
            install_fork_handler(base, len);
            Some(Local { base, len, mem })
        }
        Err(e) => {
            crate::error::warn(
                "shmem_init",
                format_args!(
                    "the data segment [{base:#x}, +{len}) could not be shared ({e}); global and static variables are not remotely accessible"
                ),
            );
            None
        }
    }
}

static FORK_RANGE: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();

/// A child made by `fork` after `shmem_init` would otherwise share the parent's globals
/// (the data segment is a shared mapping now): it gets a private copy instead.
fn install_fork_handler(base: usize, len: usize) {
    extern "C" fn child() {
        let Some(&(base, len)) = FORK_RANGE.get() else {
            return;
        };
        // A child that cannot make the pages private keeps sharing them with its parent.
        // SAFETY: runs in the single thread of a fresh child, on the data segment's whole
        // pages, which nothing else touches meanwhile.
        let _ = unsafe { courier::unshare_in_place(base as *mut u8, len) };
    }
    if FORK_RANGE.set((base, len)).is_ok() {
        // SAFETY: registers a plain function with no preconditions.
        unsafe { libc::pthread_atfork(None, None, Some(child)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static mut PROBE: u64 = 7;

    #[test]
    fn data_range_covers_globals() {
        let (s, l) = data_range().expect("the test binary has data");
        let a = &raw const PROBE as usize;
        assert!(a >= s && a < s + l, "{a:#x} not in [{s:#x}, +{l})");
        assert_eq!(s % rustix::param::page_size(), 0);
    }

    #[test]
    fn a_segment_must_lie_inside_its_key() {
        let key = (0x1000, 0x4000);
        assert!(within(0x1000, 0x4000, key));
        assert!(within(0x2000, 0x1000, key));
        assert!(!within(0x1000, 0x4001, key), "one byte past the end");
        assert!(!within(0xfff, 0x10, key), "starts before");
        assert!(!within(0x2000, u64::MAX, key), "wraps");
        assert!(
            !within(u64::MAX - 1, 1, (u64::MAX - 1, 2)),
            "the region's end wraps"
        );
    }
}
