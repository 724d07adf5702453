//! An unpacked remote key: where its owner is (the route choice `Key::unpack` makes once),
//! what the direct paths keep of the owner's record to check each access without the
//! worker, and the checks every path makes before it touches or sends anything.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::atomic::SignalOp;
use super::direct::signal_with;
use super::routes::Reach;
use crate::base::config::Config;
use crate::base::cuda;
use crate::base::sys::host_id;
use crate::base::{Error, Result, Status};
use crate::proto::endpoint::{EpId, EpRef};
use crate::proto::memreg::{
    MemRegistry, MemoryType, PeerMaps, Place, SegmentRefusal, check, segment_offset,
};
use crate::transport::dial;
use crate::transport::shm::memory::{Doorbell, Mapping, cma_probe};
use crate::wire::rkey::{RkeyRepr, access};

/// How operations reach a key's region.
pub(super) enum Path {
    /// The region belongs to this very context.
    Local(Arc<MemRegistry>),
    /// Same host: the owner's key table is mapped here; allocated regions are mapped too.
    Direct {
        peer: Arc<PeerMaps>,
        seg: Option<Arc<Mapping>>,
        cma: bool,
    },
    /// Same host, device memory: the owner's allocation opened here through its IPC
    /// handle (copies with this process's driver), checked against the owner's key table.
    DeviceIpc {
        peer: Arc<PeerMaps>,
        map: Arc<cuda::IpcMapping>,
        alloc_base: u64,
    },
    /// Through the owner's progress.
    Remote,
}

/// What the direct paths need of a same-host peer's host region mapped here, taken from
/// the owner's record when the key is unpacked and checked against the key then. For one
/// region id the record's other fields never change, so an access re-reads only its first
/// two words (`valid`, `region`), which change when the owner unmaps the region or gives
/// the slot to another: two loads from one line at a fixed address, where a full check
/// reads seven words, and none of them waits on another.
struct DirectView {
    /// Address of the owner's record's `valid` word (its `region` word follows), in the
    /// owner's key table that the key's `Path::Direct` keeps mapped here.
    head: usize,
    region: u64,
    /// The region's start in the owner's process, and its address here (in the segment
    /// mapping that `Path::Direct` holds).
    base: u64,
    ptr: usize,
    /// Bytes from `base` that the key, the record and our mapping all cover.
    span: u64,
    /// Rights that both the key and the record grant.
    access: u16,
    /// The endpoint's "failed or closed" flag (`RemoteKey::gone`, which keeps it alive).
    /// (An address, as `head` and `ptr` are, so that keys stay `Send` and `Sync`.)
    gone: usize,
}

impl DirectView {
    /// The view of `key`'s region through `m`, if the owner's record describes it as the
    /// key does (a live host region at the key's base, with the key's secret).
    fn new(peer: &PeerMaps, m: &Mapping, key: &RkeyRepr) -> Option<DirectView> {
        let rec = peer.record(key.region)?;
        let host = MemoryType::Host.code() as u64;
        let matches = rec.valid == 1
            && rec.region == key.region
            && crate::wire::rkey::secret_eq(rec.secret, key.secret)
            && rec.base == key.base
            && rec.mem_type == host
            && key.mem_type as u64 == host;
        if !matches {
            return None;
        }
        // The region starts this far into the mapped segment.
        let skip = segment_offset(key.base);
        let mapped = (m.len as u64).checked_sub(skip)?;
        Some(DirectView {
            head: peer.record_head(key.region)? as usize,
            region: key.region,
            base: key.base,
            ptr: m.ptr as usize + skip as usize,
            span: key.length.min(rec.len).min(mapped),
            access: key.access & (rec.access & 0xffff) as u16,
            gone: 0,
        })
    }
}

/// A peer's remote key, unpacked on an endpoint: the route its operations take, and what
/// the direct paths need to check an access without the worker.
pub(crate) struct Key {
    pub(super) key: RkeyRepr,
    pub(super) path: Path,
    /// Set for a same-host peer's host region mapped here (`Path::Direct` with a segment).
    view: Option<DirectView>,
    /// The endpoint it was unpacked on (and may be used on).
    owner: EpId,
    /// The endpoint's "failed or closed" flag, for keys with a path that bypasses the
    /// worker (`EpSlot::gone`).
    pub(super) gone: Option<Arc<AtomicBool>>,
    /// Wakes the owner's worker after a direct signal update: found on the endpoint's
    /// shared-memory link once it has one (it may still run on tcp when the key is
    /// unpacked).
    bell: OnceLock<Doorbell>,
}

impl Key {
    /// Whether the key was unpacked on `ep` (and may be used there).
    #[inline]
    pub(super) fn unpacked_on(&self, ep: &EpRef<'_>) -> bool {
        self.owner == ep.id()
    }

    /// The region's start and length in the owner's process.
    pub(crate) fn bounds(&self) -> (u64, u64) {
        (self.key.base, self.key.length)
    }
    /// A pointer valid in this process for `addr` in the owner's process, when the region
    /// is mapped here (same host, allocated memory, or the same context) and `addr` lies
    /// in it; `None` otherwise (`local_ptr` says why).
    pub(crate) fn direct_ptr(&self, addr: u64) -> Option<*mut u8> {
        self.local_ptr(addr).ok()
    }

    /// `direct_ptr` with the reason when there is none: `addr` outside the key's region
    /// (`OutOfRange`), a region its owner no longer maps or a key that does not match its
    /// record (`InvalidKey`), or a region not mapped in this process (`Unsupported`).
    pub(crate) fn local_ptr(&self, addr: u64) -> Result<*mut u8> {
        match self.place(addr, 1, 0)? {
            Some(p) => Ok(p.ptr),
            None => Err(Error::new(
                Status::Unsupported,
                "the region is not mapped in this process",
            )),
        }
    }
    /// How operations reach the region: `local`, `direct`, `cma`, `cuda_ipc` or `remote`.
    pub(crate) fn path(&self) -> &'static str {
        match &self.path {
            Path::Local(_) => "local",
            Path::DeviceIpc { .. } => "cuda_ipc",
            Path::Direct { seg: Some(_), .. } => "direct",
            Path::Direct { cma: true, .. } => "cma",
            _ => "remote",
        }
    }

    /// The local address of `[addr, addr + len)` when the region is mapped here and the
    /// owner's record allows `need` on that range for this key, used on `ep`; `None` for
    /// anything else (other paths, refusals), which the general path then handles and
    /// reports. The fast path of small puts, gets, atomics and puts-with-signal: the same
    /// checks as `resolve`, against the record as it was at unpack (`DirectView`) and its
    /// two words that say whether it still is.
    #[inline(always)]
    pub(super) fn direct(&self, ep: &EpRef<'_>, addr: u64, len: u64, need: u16) -> Option<*mut u8> {
        let v = self.view.as_ref()?;
        let off = addr.wrapping_sub(v.base);
        if v.access & need != need
            || off > v.span
            || len > v.span - off
            || self.owner != ep.id()
            // SAFETY: set from `self.gone`, which keeps the flag alive.
            || unsafe { (*(v.gone as *const AtomicBool)).load(Ordering::Relaxed) }
        {
            return None;
        }
        let head = v.head as *const AtomicU64;
        // SAFETY: `head` and the word after it lie in the owner's key table, which `path`
        // keeps mapped as long as this key lives; the table is only read atomically.
        let (valid, region) = unsafe {
            (
                (*head).load(Ordering::Acquire),
                (*head.add(1)).load(Ordering::Relaxed),
            )
        };
        (valid == 1 && region == v.region).then(|| (v.ptr as *mut u8).wrapping_add(off as usize))
    }

    /// The doorbell of the owner's worker behind this key's endpoint, once that endpoint
    /// runs on shared memory; asked on `ep`, the endpoint of the operation (`None` when
    /// that is not the key's).
    #[inline]
    pub(super) fn doorbell(&self, ep: &EpRef<'_>) -> Option<&Doorbell> {
        match self.bell.get() {
            Some(b) => Some(b),
            None => self.doorbell_lookup(ep),
        }
    }

    /// `doorbell` before it is known: taken from the endpoint's link (under the worker's
    /// lock) once that is shared memory.
    #[cold]
    #[inline(never)]
    fn doorbell_lookup(&self, ep: &EpRef<'_>) -> Option<&Doorbell> {
        if !matches!(self.path, Path::Direct { .. }) || self.owner != ep.id() {
            return None;
        }
        let b = ep
            .with(|st, e| Ok(st.ep(e).and_then(|ep| ep.tx.as_ref()?.doorbell())))
            .ok()
            .flatten()?;
        Some(self.bell.get_or_init(|| b))
    }

    /// Whether a signal word behind this key may be updated directly now: in this
    /// context's own memory always; in a same-host peer's once the endpoint runs on shared
    /// memory, whose link wakes the owner's worker after the update. Until then (the
    /// endpoint still on the tcp link it started on) the update goes through the owner,
    /// as a frame that wakes it.
    pub(super) fn signal_direct_ready(&self, ep: &EpRef<'_>) -> bool {
        !matches!(self.path, Path::Direct { .. }) || self.doorbell(ep).is_some()
    }

    /// Update the signal word at `sig` (mapped here through this key) for a direct
    /// put-with-signal, and wake the owner's worker if it sleeps there (`signal_with`).
    ///
    /// # Safety
    /// `sig` must be an aligned, valid, host-memory word.
    pub(super) unsafe fn signal_direct(
        &self,
        ep: &EpRef<'_>,
        sig: *mut u8,
        op: SignalOp,
        value: u64,
    ) {
        // SAFETY: forwarded contract.
        unsafe { signal_with(self.doorbell(ep), sig, op, value) }
    }

    /// Whether the key itself grants `need` on `[addr, addr + len)`: checked on every path
    /// before anything is touched or sent, so an operation the key does not cover is refused
    /// whole, at once (the owner's record is checked as well, by this process where it can
    /// read it, else by the owner).
    #[inline]
    fn claims(&self, addr: u64, len: u64, need: u16) -> Result<()> {
        let k = &self.key;
        let inside = addr >= k.base
            && addr
                .checked_add(len)
                .is_some_and(|end| k.base.checked_add(k.length).is_some_and(|lim| end <= lim));
        if inside && k.access & need == need {
            return Ok(());
        }
        Err(self.claim_refusal(addr, len, need))
    }

    #[cold]
    #[inline(never)]
    fn claim_refusal(&self, addr: u64, len: u64, need: u16) -> Error {
        let k = &self.key;
        if k.access & need != need {
            let what = match need {
                access::READ => "remote read",
                access::WRITE => "remote write",
                _ => "remote atomic",
            };
            return Error::msg(
                Status::AccessDenied,
                format!("the key of region {:#x} grants no {what} access", k.region),
            );
        }
        Error::msg(
            Status::OutOfRange,
            format!(
                "access [{addr:#x}, +{len}) outside the key's region [{:#x}, +{})",
                k.base, k.length
            ),
        )
    }

    /// Check an access against the owner's record; where it lands if mapped here.
    #[inline]
    pub(super) fn resolve(&self, addr: u64, len: u64, need: u16) -> Result<Option<Place>> {
        let place = self.place(addr, len, need)?;
        if need == access::ATOMIC && place.is_some_and(|p| p.device) {
            return Err(Error::new(
                Status::Unsupported,
                "atomics on CUDA device memory are not supported (the CPU cannot reach it)",
            ));
        }
        Ok(place)
    }

    #[inline]
    pub(crate) fn place(&self, addr: u64, len: u64, need: u16) -> Result<Option<Place>> {
        self.claims(addr, len, need)?;
        let direct_record = |peer: &PeerMaps| {
            let rec = peer.record(self.key.region).ok_or_else(|| {
                Error::new(Status::InvalidKey, "region id out of range (forged key)")
            })?;
            check(&rec, self.key.region, self.key.secret, addr, len, need)?;
            if rec.mem_type != self.key.mem_type as u64 {
                // Honest keys say what their memory is: device memory goes through its
                // IPC handle or its owner, host memory never through a device handle.
                return Err(Error::new(
                    Status::InvalidKey,
                    "the key's memory type is not the owner's",
                ));
            }
            Ok(rec)
        };
        match &self.path {
            Path::Local(reg) => reg
                .lookup_place(self.key.region, self.key.secret, addr, len, need)
                .map(Some),
            Path::Direct { peer, seg, .. } => {
                let rec = direct_record(peer)?;
                // The owner's record said where the region is; the range must also lie in
                // what we mapped of its segment (the key's length), whatever the record says.
                Ok(seg.as_ref().and_then(|m| {
                    let off = addr - rec.base + segment_offset(rec.base);
                    let inside = rec.base == self.key.base
                        && off.checked_add(len).is_some_and(|end| end <= m.len as u64);
                    inside.then(|| Place {
                        ptr: m.ptr.wrapping_add(off as usize),
                        device: false,
                    })
                }))
            }
            Path::DeviceIpc {
                peer,
                map,
                alloc_base,
            } => {
                let rec = direct_record(peer)?;
                if rec.base != self.key.base {
                    return Ok(None);
                }
                // Inside the opened allocation, whatever the key claims about it
                // (`addr >= rec.base >= alloc_base`: checked above and at unpack).
                let off = addr - alloc_base;
                if off.checked_add(len).is_none_or(|end| end > map.len as u64) {
                    return Ok(None);
                }
                Ok(Some(Place {
                    ptr: (map.ptr + off as usize) as *mut u8,
                    device: true,
                }))
            }
            Path::Remote => Ok(None),
        }
    }
}

impl Key {
    /// Unpack a peer's remote key for use on endpoint `ep` of a context with registry
    /// `reg` and configuration `cfg`: where the key's owner is decides the route
    /// (`Reach::find`), and the direct paths map what they need now.
    pub(crate) fn unpack(
        ep: &EpRef<'_>,
        bytes: &[u8],
        reg: &Arc<MemRegistry>,
        cfg: &Config,
    ) -> Result<Key> {
        let key =
            RkeyRepr::unpack(bytes).map_err(|e| Error::msg(Status::InvalidKey, e.to_string()))?;
        let reg = reg.clone();
        let same_host = key.host_id == host_id();
        // A peer on this host is reached directly whenever shared memory may be used, also
        // while the endpoint still runs on the tcp link it started on (its shm upgrade may
        // land after this key is unpacked). `routes` describes these choices for tools.
        let reach = Reach::find(
            ep.with(|st, e| Ok(st.ep_caps(e))).ok().flatten().as_ref(),
            key.pid == std::process::id() && key.ctx_id == reg.ctx_id,
            same_host,
            dial::upgrade_allowed(cfg),
            cfg.shm_cma,
            || cma_probe(key.pid, key.base),
        );
        let path = if reach == Reach::SameContext {
            Path::Local(reg)
        } else if reach != Reach::Elsewhere && key.mem_type == MemoryType::Cuda.code() {
            // Device memory: opened here through its IPC handle (used as it is when another
            // context of this process owns it), or through the owner.
            let open = || -> Result<Path> {
                let ipc = key.ipc.ok_or_else(|| {
                    Error::new(Status::Unsupported, "the key carries no IPC handle")
                })?;
                let driver = cuda::load(&cfg.cuda_lib)?;
                let peer = reg.peer(&key)?;
                let own = key.pid == std::process::id();
                let map = peer.device_region(driver, key.region, &ipc, own)?;
                Ok(Path::DeviceIpc {
                    peer,
                    map,
                    alloc_base: ipc.alloc_base,
                })
            };
            open().unwrap_or_else(|e| {
                tracing::info!(
                    "device memory of pid {}: {e}; operations go through the owner",
                    key.pid
                );
                Path::Remote
            })
        } else if let Reach::SameHost { cma } = reach {
            match reg.peer(&key) {
                Ok(peer) => {
                    let seg = if key.region_fd >= 0 {
                        match peer.segment(key.region, key.region_fd, key.length as usize) {
                            Ok(m) => Some(m),
                            // A key naming another of the owner's descriptors is a lie.
                            Err(SegmentRefusal::Forged(e)) => return Err(e),
                            // Stale, or not to be mapped here: the record decides at each
                            // operation, which takes another way.
                            Err(SegmentRefusal::Unavailable(e)) => {
                                tracing::debug!(
                                    "segment of region {:#x} of pid {}: {e}",
                                    key.region,
                                    key.pid
                                );
                                None
                            }
                        }
                    } else {
                        None
                    };
                    Path::Direct { peer, seg, cma }
                }
                Err(e) => {
                    tracing::info!(
                        "remote key of pid {}: {e}; operations go through the owner",
                        key.pid
                    );
                    Path::Remote
                }
            }
        } else {
            Path::Remote
        };
        let direct = match &path {
            Path::Local(_) | Path::DeviceIpc { .. } => true,
            Path::Direct { seg, cma, .. } => seg.is_some() || *cma,
            Path::Remote => false,
        };
        let gone = if direct {
            // A fence on this endpoint must now order operations through the owner.
            ep.with(|st, e| {
                let Some(ep) = st.ep(e) else { return Ok(None) };
                ep.rma_direct_keys = true;
                let (gone, mixed) = (ep.gone.clone(), ep.rma_via_owner);
                if mixed {
                    st.onesided
                        .mixed
                        .store(true, std::sync::atomic::Ordering::Release);
                }
                Ok(Some(gone))
            })?
        } else {
            None
        };
        let view = match (&path, &gone) {
            (
                Path::Direct {
                    peer, seg: Some(m), ..
                },
                Some(g),
            ) => DirectView::new(peer, m, &key).map(|v| DirectView {
                gone: Arc::as_ptr(g) as usize,
                ..v
            }),
            _ => None,
        };
        Ok(Key {
            key,
            path,
            view,
            owner: ep.id(),
            gone,
            bell: OnceLock::new(),
        })
    }
}
