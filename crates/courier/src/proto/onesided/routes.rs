//! How one-sided operations reach a peer's memory, as data for tools (`courier info`): the
//! choices `Key::unpack` and the operations make, and the limits that apply on each route.
//!
//! `Key::unpack` decides where a key's owner is with [`Reach::find`]; the operations then
//! pick a route per call. [`key_route`] and [`op_route`] describe those per-call choices and
//! [`OwnerLimits`] the frames used when the owner carries an operation out. The tests in
//! `tests/onesided.rs` run every operation over self, shm (with and without CMA) and tcp, on
//! allocated and registered memory, and check it behaves as described here, so a change to
//! the operations that is not made here too fails them.

use crate::base::config::CmaPolicy;
use crate::transport::{Caps, RndvMode};
use crate::wire::Kind;

/// Where a remote key's owner is, seen from the endpoint the key is unpacked on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// This very context (a `self` peer, whatever link carries its endpoint).
    SameContext,
    /// This host, on a link through which the owner's memory may be mapped here: shared
    /// memory, or a tcp link while shared memory is allowed (the endpoint may still move
    /// to it). `cma`: registered memory is reached with CMA (`process_vm_writev`/`readv`).
    SameHost {
        /// Whether CMA reaches the owner's registered memory.
        cma: bool,
    },
    /// Another host, or this host over tcp with shared memory excluded.
    Elsewhere,
}

impl Reach {
    /// The reach `Endpoint::rkey_unpack` works with. `link`: the endpoint's link (`None`
    /// while it connects); `same_context`/`same_host`: the key's owner; `shm_allowed`:
    /// `COURIER_TLS` allows shm; `cma_policy`: `COURIER_SHM_CMA`. `probe` (a one-word CMA
    /// read of the owner's region) is called only when the link has not shown that CMA works
    /// and the answer matters.
    pub fn find(
        link: Option<&Caps>,
        same_context: bool,
        same_host: bool,
        shm_allowed: bool,
        cma_policy: CmaPolicy,
        probe: impl FnOnce() -> bool,
    ) -> Reach {
        if same_context {
            return Reach::SameContext;
        }
        let reads_remote = link.is_some_and(|c| c.rndv == RndvMode::RemoteRead);
        // A link that does not read the peer's memory may still be replaced by shm.
        let upgrading = !reads_remote && shm_allowed;
        if !same_host || !(reads_remote || upgrading) {
            return Reach::Elsewhere;
        }
        let cma =
            link.is_some_and(link_cma) || (upgrading && cma_policy != CmaPolicy::No && probe());
        Reach::SameHost { cma }
    }
}

/// Whether a link reaches its peer's memory with CMA (a link to a process of this host
/// whose CMA probe passed).
pub fn link_cma(c: &Caps) -> bool {
    c.peer_memory && c.rndv == RndvMode::RemoteRead
}

/// The lanes of an endpoint whose link has `caps`, by feature (`tag`, `am`, `stream`,
/// `rma`, `amo`, in that order), each with the transports it uses (`shm/memory`,
/// `cma/memory`, ...). Large tag and active messages of a shm link whose CMA probe passed
/// are read with CMA; a same-host shm link stores into allocated memory directly and
/// reaches registered memory with CMA (when the probe passed) or through the owner;
/// elsewhere the owner carries every operation out.
pub fn lanes(caps: &Caps) -> [(&'static str, Vec<String>); 5] {
    let lane = format!("{}/{}", caps.name, caps.device);
    let cma = link_cma(caps).then(|| "cma/memory".to_string());
    let big: Vec<String> = std::iter::once(lane.clone()).chain(cma.clone()).collect();
    let (rma, amo) = if caps.peer_memory {
        let direct = "direct/memory".to_string();
        (
            std::iter::once(direct.clone())
                .chain(cma)
                .chain(std::iter::once(lane.clone()))
                .collect(),
            vec![direct, lane.clone()],
        )
    } else {
        (vec![lane.clone()], vec![lane.clone()])
    };
    [
        ("tag", big.clone()),
        ("am", big),
        ("stream", vec![lane]),
        ("rma", rma),
        ("amo", amo),
    ]
}

/// `lanes` as one line, as the selection line at `COURIER_LOG_LEVEL=info` and
/// `courier info -e` print it: `tag(shm/memory cma/memory) am(..) stream(..) rma(..) amo(..)`.
pub fn lanes_line(caps: &Caps) -> String {
    let parts: Vec<String> = lanes(caps)
        .iter()
        .map(|(f, t)| format!("{f}({})", t.join(" ")))
        .collect();
    parts.join(" ")
}

/// The memory a remote key names, as far as routes depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetMemory {
    /// Host memory allocated by `mem_map` (it lives in a shared segment).
    Allocated,
    /// Host memory the owner registered (its own buffer).
    Registered,
    /// CUDA device memory, allocated or registered.
    Cuda,
}

impl TargetMemory {
    /// Every kind.
    pub const ALL: [TargetMemory; 3] = [
        TargetMemory::Allocated,
        TargetMemory::Registered,
        TargetMemory::Cuda,
    ];

    /// Short name: `allocated`, `registered`, `cuda`.
    pub fn name(self) -> &'static str {
        match self {
            TargetMemory::Allocated => "allocated",
            TargetMemory::Registered => "registered",
            TargetMemory::Cuda => "cuda",
        }
    }
}

/// A one-sided operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `Endpoint::put` (and `put_iov`).
    Put,
    /// `Endpoint::get` (and `get_iov`).
    Get,
    /// `Endpoint::put_signal`.
    PutSignal,
    /// `Endpoint::atomic`, every [`AtomicOp`](crate::AtomicOp), on 32- and 64-bit words.
    Atomic,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 4] = [Op::Put, Op::Get, Op::PutSignal, Op::Atomic];

    /// Name: `put`, `get`, `put_signal`, `atomic`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Get => "get",
            Op::PutSignal => "put_signal",
            Op::Atomic => "atomic",
        }
    }
}

/// Word widths of atomics, in bits. Every [`AtomicOp`](crate::AtomicOp) works on both and returns the
/// word's old value.
pub const ATOMIC_BITS: [u32; 2] = [32, 64];

/// How an operation reaches the owner's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The owner is this context: copies and CPU atomics in this process.
    Local,
    /// Loads, stores and CPU atomics in the owner's shared segment, mapped here.
    Direct,
    /// `process_vm_writev` / `process_vm_readv` into the owner's memory.
    Cma,
    /// The owner's device allocation, opened here through its CUDA IPC handle.
    CudaIpc,
    /// Frames the owner's worker carries out as it progresses (answered for gets and
    /// atomics; puts are confirmed by `flush`).
    Remote,
    /// Refused with `Status::Unsupported`.
    Unsupported,
}

impl Route {
    /// The word `RemoteKey::path()` uses (`unsupported` for refusals).
    pub fn name(self) -> &'static str {
        match self {
            Route::Local => "local",
            Route::Direct => "direct",
            Route::Cma => "cma",
            Route::CudaIpc => "cuda_ipc",
            Route::Remote => "remote",
            Route::Unsupported => "unsupported",
        }
    }

    /// What it does, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Route::Local => "copies and CPU atomics in this process",
            Route::Direct => "loads, stores and CPU atomics in the owner's shared segment",
            Route::Cma => "process_vm_writev / process_vm_readv into the owner's memory",
            Route::CudaIpc => {
                "device copies into the owner's allocation, opened through its IPC handle"
            }
            Route::Remote => "frames carried out by the owner's worker as it progresses",
            Route::Unsupported => "refused",
        }
    }

    /// Whether the whole operation is done by this process in the call that starts it,
    /// whatever its size.
    pub fn in_call(self) -> bool {
        matches!(
            self,
            Route::Local | Route::Direct | Route::Cma | Route::CudaIpc
        )
    }
}

/// What `RemoteKey::path()` says for a key naming `mem` at `reach`, when mapping what the
/// route needs works (the owner's key table, its segment, its IPC handle); otherwise
/// `remote`.
pub fn key_route(reach: Reach, mem: TargetMemory) -> Route {
    match (reach, mem) {
        (Reach::SameContext, _) => Route::Local,
        (Reach::SameHost { .. }, TargetMemory::Cuda) => Route::CudaIpc,
        (Reach::SameHost { .. }, TargetMemory::Allocated) => Route::Direct,
        (Reach::SameHost { cma: true }, TargetMemory::Registered) => Route::Cma,
        (Reach::SameHost { cma: false }, TargetMemory::Registered) | (Reach::Elsewhere, _) => {
            Route::Remote
        }
    }
}

/// How `op` on memory `mem` at `reach` goes. For `PutSignal`, the signal word lies in host
/// memory allocated by the same owner (signal words need host memory).
pub fn op_route(reach: Reach, mem: TargetMemory, op: Op) -> Route {
    let key = key_route(reach, mem);
    match op {
        Op::Put | Op::Get => key,
        // CPU atomics where the word is mapped here; device memory has none.
        Op::Atomic => match (mem, key) {
            (TargetMemory::Cuda, _) => Route::Unsupported,
            (_, Route::Local | Route::Direct) => key,
            _ => Route::Remote,
        },
        // In place only when the signal word is mapped here and the data is mapped here or
        // reached with CMA: the data is written, then the signal, in this process.
        Op::PutSignal => {
            let signal = key_route(reach, TargetMemory::Allocated);
            let reached = matches!(
                key,
                Route::Local | Route::Direct | Route::CudaIpc | Route::Cma
            );
            if reached && matches!(signal, Route::Local | Route::Direct) {
                key
            } else {
                Route::Remote
            }
        }
    }
}

/// Sizes that apply when the owner carries operations out ([`Route::Remote`]) over a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnerLimits {
    /// Payload bytes of one put frame: longer puts are split into frames of this size.
    pub put_piece: usize,
    /// Payload bytes of one put-with-signal frame; the signal rides on the last.
    pub put_signal_piece: usize,
    /// Payload bytes of one frame of a get's answer.
    pub get_piece: usize,
    /// Puts (and puts with signal) of at least this many bytes are written from the
    /// caller's buffer; shorter ones are copied by the link (`None`: always copied).
    pub zcopy_from: Option<usize>,
    /// The link's `Caps::place_min` (`None`: it never places frames).
    place_min: Option<usize>,
}

impl OwnerLimits {
    /// The limits on a link with `caps` (both ends of a link share its frame size).
    pub fn of(caps: &Caps) -> OwnerLimits {
        OwnerLimits {
            put_piece: Kind::Put.payload_max(caps.max_frame),
            put_signal_piece: Kind::PutSignal.payload_max(caps.max_frame),
            get_piece: Kind::GetResp.payload_max(caps.max_frame),
            zcopy_from: (caps.zcopy_min != usize::MAX).then_some(caps.zcopy_min),
            place_min: (caps.place_min != usize::MAX).then_some(caps.place_min),
        }
    }

    /// The payload size from which the frames of `op` on `mem` may be read from the link
    /// straight into their destination instead of a receive buffer (`proto/place.rs`):
    /// put frames (with or without a signal) into the owner's host memory, a get's answer
    /// into the caller's buffer. `None` where that never happens: links that do not place,
    /// device memory at the owner, atomics.
    pub fn placed_from(&self, op: Op, mem: TargetMemory) -> Option<usize> {
        let kind = match (op, mem) {
            (Op::Put, TargetMemory::Allocated | TargetMemory::Registered) => Kind::Put,
            (Op::PutSignal, TargetMemory::Allocated | TargetMemory::Registered) => Kind::PutSignal,
            (Op::Get, _) => Kind::GetResp,
            _ => return None,
        };
        self.place_min.map(|p| p.saturating_sub(kind.header_len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_reach_and_memory() {
        use Route::*;
        use TargetMemory::*;
        let near = Reach::SameHost { cma: true };
        let near_no_cma = Reach::SameHost { cma: false };
        let row = |r, m| Op::ALL.map(|op| op_route(r, m, op));
        // put, get, put_signal, atomic
        assert_eq!(row(Reach::SameContext, Allocated), [Local; 4]);
        assert_eq!(
            row(Reach::SameContext, Cuda),
            [Local, Local, Local, Unsupported]
        );
        assert_eq!(row(near, Allocated), [Direct; 4]);
        assert_eq!(row(near, Registered), [Cma, Cma, Cma, Remote]);
        assert_eq!(row(near_no_cma, Registered), [Remote; 4]);
        assert_eq!(row(near, Cuda), [CudaIpc, CudaIpc, CudaIpc, Unsupported]);
        assert_eq!(row(Reach::Elsewhere, Allocated), [Remote; 4]);
        assert_eq!(
            row(Reach::Elsewhere, Cuda),
            [Remote, Remote, Remote, Unsupported]
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "tcp sockets (setsockopt SO_SNDBUF): system calls Miri does not model"
    )]
    fn reach_follows_the_link() {
        let tcp = crate::transport::tcp::pair_for_tests().0.0;
        let tcp = crate::transport::LinkTx::Tcp(tcp);
        let c = tcp.caps();
        let never = || panic!("probed without need");
        assert_eq!(
            Reach::find(Some(c), true, false, true, CmaPolicy::Auto, never),
            Reach::SameContext
        );
        assert_eq!(
            Reach::find(Some(c), false, true, false, CmaPolicy::Auto, never),
            Reach::Elsewhere
        );
        assert_eq!(
            Reach::find(Some(c), false, false, true, CmaPolicy::Auto, never),
            Reach::Elsewhere
        );
        // tcp on this host with shm allowed: may move to shm; CMA as the probe says.
        assert_eq!(
            Reach::find(Some(c), false, true, true, CmaPolicy::Auto, || true),
            Reach::SameHost { cma: true }
        );
        assert_eq!(
            Reach::find(Some(c), false, true, true, CmaPolicy::No, never),
            Reach::SameHost { cma: false }
        );
        assert_eq!(
            Reach::find(None, false, true, true, CmaPolicy::Auto, || false),
            Reach::SameHost { cma: false }
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "tcp sockets (setsockopt SO_SNDBUF): system calls Miri does not model"
    )]
    fn owner_limits_follow_the_frame_sizes() {
        let tcp = crate::transport::tcp::pair_for_tests().0.0;
        let c = crate::transport::LinkTx::Tcp(tcp).caps().clone();
        let l = OwnerLimits::of(&c);
        assert_eq!(l.put_piece, c.max_frame - Kind::Put.header_len());
        assert_eq!(
            l.put_signal_piece,
            c.max_frame - Kind::PutSignal.header_len()
        );
        assert_eq!(l.get_piece, c.max_frame - Kind::GetResp.header_len());
        assert_eq!(l.zcopy_from, Some(c.zcopy_min));
        let put = l.placed_from(Op::Put, TargetMemory::Registered);
        assert_eq!(put, Some(c.place_min - Kind::Put.header_len()));
        assert_eq!(l.placed_from(Op::Put, TargetMemory::Cuda), None);
        let ps = l.placed_from(Op::PutSignal, TargetMemory::Allocated);
        assert_eq!(ps, Some(c.place_min - Kind::PutSignal.header_len()));
        assert_eq!(l.placed_from(Op::PutSignal, TargetMemory::Cuda), None);
        assert!(l.placed_from(Op::Get, TargetMemory::Cuda).is_some());
        let (lb, _) = crate::transport::loopback::pair();
        let c = crate::transport::LinkTx::Loopback(lb.0).caps().clone();
        let l = OwnerLimits::of(&c);
        assert_eq!(l.zcopy_from, None);
        for op in Op::ALL {
            assert_eq!(l.placed_from(op, TargetMemory::Allocated), None);
        }
    }
}
