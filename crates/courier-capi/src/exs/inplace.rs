//! Registrations moved into shared memory in place. A large registration of memory mapped
//! for the buffer itself (a large `malloc`, an `mmap`) is moved, pages whole, into a
//! shared segment at the same addresses with the same contents
//! (`MemMapParams::share_in_place`), so that a peer on shared memory copies into and out of
//! it with plain loads and stores through its own mapping of the segment, where it would
//! otherwise go through the kernel (CMA: pinning and a copy per call). When the
//! registration ends the pages become private again, contents kept, so that `realloc`,
//! `fork` and the rest see ordinary memory.
//!
//! Only memory that holds nothing but the buffer's own pages moves: `/proc/self/maps` must
//! show private anonymous memory that is not the brk heap, not a program's or library's
//! bss (other data shares the first and last pages there, and another thread may write it
//! while the pages move) and not a stack; a mapping that a guard page (`---p`) touches is
//! a thread's stack (guard below) or an allocator's arena (guard above) and stays too.
//! Pages already shared (`rw-s`: a registration that moved them before) never move again,
//! so a segment is never taken from under its peers. `COURIER_EXS_SHARE_MIN` sets the
//! smallest registration moved.

use std::sync::Mutex;

use courier_core::{Context, MemMapParams, Memory};

/// Held while pages move, either way.
static MOVING: Mutex<()> = Mutex::new(());

/// The alignment of glibc's per-thread arenas (`HEAP_MAX_SIZE` on 64-bit systems).
const ARENA_ALIGN: usize = 64 << 20;

/// The pages of a registration that moved: `[start, start + span)`, the segment's inode.
pub(crate) struct Moved {
    start: usize,
    span: usize,
    inode: String,
}

/// Move the pages holding `[addr, addr + len)` and register the range with `rights`, if
/// the configuration and the memory allow it; `None` (and a debug line saying why) leaves
/// the caller to register the range as it is.
pub(crate) fn share(
    ctx: &Context,
    addr: usize,
    len: usize,
    rights: u16,
) -> Option<(Memory, Moved)> {
    if ctx.config().exs_share_min.is_none_or(|m| len < m.max(1)) {
        return None;
    }
    let (start, span) = pages(addr, len)?;
    // One move at a time: two registrations of the same pages must not both find them
    // private and move them twice (the second would take them from under the first).
    let _one = MOVING.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(why) = movable(start, span) {
        tracing::debug!("EXS registration [{addr:#x}, +{len}) stays where it is: {why}");
        return None;
    }
    // exs_mregister's contract (exs.h): the region stays valid until exs_mderegister, and
    // no thread writes the pages holding it while exs_mregister runs. `movable` found them
    // memory mapped for the buffer alone (no allocator or other thread keeps data there).
    // SAFETY: so the range may be registered, and its pages moved, as share_in_place asks.
    let params = unsafe { MemMapParams::share_in_place(addr as *mut u8, len) };
    let mem = match ctx.mem_map(params.access(rights)) {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!("EXS registration [{addr:#x}, +{len}) not moved: {e}");
            return None;
        }
    };
    match segment_inode(start, span) {
        Some(inode) => Some((mem, Moved { start, span, inode })),
        None => {
            // Moved, but not found where it went: registered as it is (the pages stay
            // shared with no one).
            tracing::debug!(
                "EXS registration [{addr:#x}, +{len}): its segment is not in /proc/self/maps"
            );
            Some((
                mem,
                Moved {
                    start,
                    span,
                    inode: String::new(),
                },
            ))
        }
    }
}

impl Moved {
    /// Make the pages private again, contents kept, if they are still the segment they
    /// moved into (a program that unmapped them before deregistering has other memory
    /// there now, which is left alone).
    pub(crate) fn restore(self) {
        let _one = MOVING.lock().unwrap_or_else(|p| p.into_inner());
        if self.inode.is_empty()
            || segment_inode(self.start, self.span).as_deref() != Some(&self.inode)
        {
            tracing::debug!(
                "EXS registration's pages at {:#x} are no longer its segment: left as they are",
                self.start
            );
            return;
        }
        // `[start, start + span)` is our segment's mapping (checked just above), whole
        // pages; nothing in flight uses them (exs_mderegister refuses while something does)
        // and Courier's region of them is unmapped right after (`Mem`'s `mem` drops next).
        // SAFETY: and exs_mderegister's contract says no thread touches them meanwhile.
        if let Err(e) = unsafe { courier_core::unshare_in_place(self.start as *mut u8, self.span) }
        {
            tracing::warn!(
                "EXS: moved pages at {:#x} could not be made private again: {e}",
                self.start
            );
        }
    }
}

/// The whole pages holding `[addr, addr + len)`: their start and length.
fn pages(addr: usize, len: usize) -> Option<(usize, usize)> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let start = addr & !(page - 1);
    let end = addr.checked_add(len)?.checked_next_multiple_of(page)?;
    Some((start, end - start))
}

fn maps() -> Result<String, String> {
    std::fs::read_to_string("/proc/self/maps").map_err(|e| format!("/proc/self/maps: {e}"))
}

/// Whether pages `[start, start + span)` hold nothing but memory mapped for themselves.
fn movable(start: usize, span: usize) -> Result<(), String> {
    let text = maps()?;
    let vmas: Vec<Vma> = text.lines().filter_map(Vma::parse).collect();
    let end = start + span;
    let mut at = start;
    for (i, v) in vmas.iter().enumerate() {
        if v.end <= at || at >= end {
            continue;
        }
        if v.start > at {
            return Err(format!("{at:#x} is not mapped"));
        }
        if !(v.perms.starts_with("rw-p") && v.inode == "0" && v.path.is_empty()) {
            return Err(format!(
                "{at:#x} lies in {:?}, not private anonymous memory",
                v.line
            ));
        }
        let below = i
            .checked_sub(1)
            .and_then(|j| vmas.get(j))
            .filter(|w| w.end == v.start);
        let above = vmas.get(i + 1).filter(|w| w.start == v.end);
        let guard = |w: Option<&Vma>| w.is_some_and(|w| w.perms.starts_with("---"));
        // A thread's stack has its guard page right below it; an allocator's arena (as
        // glibc's, aligned to its 64 MiB) has the part it has not used yet right above.
        if guard(below) {
            return Err(format!(
                "{:?} is a thread's stack (a guard page below it)",
                v.line
            ));
        }
        if guard(above) && v.start.is_multiple_of(ARENA_ALIGN) {
            return Err(format!("{:?} is an allocator's arena", v.line));
        }
        // A bss lies right above its file's private data; a shared file mapping below
        // (another segment, a peer's shared memory) says nothing of what this memory is.
        if let Some(w) = below.filter(|w| w.perms.starts_with("rw-p") && w.inode != "0") {
            return Err(format!(
                "{:?} is the bss of a program or library (its data {:?} lies below)",
                v.line, w.line
            ));
        }
        at = v.end;
    }
    if at < end {
        return Err(format!("{at:#x} is not mapped"));
    }
    Ok(())
}

/// The inode of the one shared segment mapped over all of `[start, start + span)`.
fn segment_inode(start: usize, span: usize) -> Option<String> {
    let text = maps().ok()?;
    let end = start + span;
    let mut at = start;
    let mut inode: Option<String> = None;
    for v in text.lines().filter_map(Vma::parse) {
        if v.end <= at || at >= end {
            continue;
        }
        let ours = v.start <= at
            && v.perms.starts_with("rw-s")
            && v.path.starts_with("/memfd:courier-in-place")
            && inode.as_deref().is_none_or(|i| i == v.inode);
        if !ours {
            return None;
        }
        inode = Some(v.inode.to_string());
        at = v.end;
    }
    inode.filter(|_| at >= end)
}

/// One line of `/proc/self/maps`.
struct Vma<'a> {
    start: usize,
    end: usize,
    perms: &'a str,
    inode: &'a str,
    path: &'a str,
    line: &'a str,
}

impl<'a> Vma<'a> {
    fn parse(line: &'a str) -> Option<Vma<'a>> {
        let mut f = line.split_whitespace();
        let (a, b) = f.next()?.split_once('-')?;
        let perms = f.next()?;
        let _offset = f.next()?;
        let _dev = f.next()?;
        let inode = f.next()?;
        Some(Vma {
            start: usize::from_str_radix(a, 16).ok()?,
            end: usize::from_str_radix(b, 16).ok()?,
            perms,
            inode,
            path: f.next().unwrap_or(""),
            line,
        })
    }
}
