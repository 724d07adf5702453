//! The table of `COURIER_*` variables: name, default, help and accepted values of each.

/// One configuration variable.
#[derive(Clone, Copy, Debug)]
pub struct Var {
    /// Full name, e.g. `COURIER_TLS`.
    pub name: &'static str,
    /// Default value as written in the environment.
    pub default: &'static str,
    /// One-line help.
    pub help: &'static str,
    /// What values are accepted, for error messages.
    pub accepts: &'static str,
}

/// The table. `courier info -c` prints it; the C ABI lists it.
pub const VARS: &[Var] = &[
    Var {
        name: "COURIER_TLS",
        default: "all",
        help: "Transports to use: 'all', a comma list of self,shm,tcp (aliases of shm: sm, posix, cma), or '^' followed by a list to exclude",
        accepts: "all | self,shm,tcp | ^list (names in any case; aliases of shm: sm, posix, cma)",
    },
    Var {
        name: "COURIER_NET_DEVICES",
        default: "all",
        help: "Network interfaces a worker listens on and puts in its address for tcp: 'all' or a comma list of interface names (e.g. lo,eth0); a connection to a listener's socket address goes the way the kernel routes it",
        accepts: "all | comma list of interface names",
    },
    Var {
        name: "COURIER_AUTH",
        default: "auto",
        help: "Who may connect: 'auto' (with a key every peer must prove it holds it; without one only this host's peers are accepted), 'required' (a key is needed and every peer proves it), 'off' (any peer that reaches the worker; trusted networks only)",
        accepts: "auto | required | off",
    },
    Var {
        name: "COURIER_AUTH_KEY_FILE",
        default: "",
        help: "File holding the shared authentication key (at least 16 bytes; the user's own, mode 0600, as ssh wants its keys); unset: the job's key under `courier run`, else none",
        accepts: "a path, or empty",
    },
    Var {
        name: "COURIER_LOG_LEVEL",
        default: "warn",
        help: "Logging level: error, warn, info, debug, trace (any case; fatal = error, warning = warn)",
        accepts: "error | warn | info | debug | trace",
    },
    Var {
        name: "COURIER_RNDV_THRESH",
        default: "auto",
        help: "Message size from which tag and active messages use rendezvous ('auto' picks per transport)",
        accepts: "auto | a size such as 8192, 16k, 1m",
    },
    Var {
        name: "COURIER_CMA_SPLIT",
        default: "256k",
        help: "Rendezvous size from which both sides of a shared-memory link copy half of a message each with CMA, in parallel ('off' disables)",
        accepts: "off | a size such as 256k, 1m",
    },
    Var {
        name: "COURIER_RNDV_PIECE",
        default: "1m",
        help: "Most bytes of single-copy rendezvous reads and writes made in one call into the library (small copies share it, a longer one goes a piece per call); pieces shrink to take about 30 us when memory is slow ('off': whole copies)",
        accepts: "off | a size such as 512k, 1m",
    },
    Var {
        name: "COURIER_SHM_SEGMENT_COPY",
        default: "yes",
        help: "Rendezvous on shared memory copies buffers allocated by mem_map with plain loads and stores through their shared segment, instead of CMA",
        accepts: "yes | no (any case; also on/off, y/n, 1/0)",
    },
    Var {
        name: "COURIER_EXS_SHARE_MIN",
        default: "64k",
        help: "Extended Sockets: exs_mregister moves a registration of at least this size that lies in private anonymous memory (not the brk heap, not a stack) into a shared segment in place, so that a peer on shared memory copies into and out of it with plain loads and stores instead of CMA ('off' disables)",
        accepts: "off | a size such as 64k, 1m",
    },
    Var {
        name: "COURIER_KEEPALIVE_INTERVAL",
        default: "1s",
        help: "How often a link checks that its peer is alive: TCP keepalive probes on an idle tcp connection (whole seconds: rounded up, at least 1s), and, on every transport, a keepalive frame to a peer this side waits on that has said nothing for this long",
        accepts: "a duration above 0: a number with us, ms, s or m (minutes), e.g. 1s, 2.5s",
    },
    Var {
        name: "COURIER_KEEPALIVE_TIMEOUT",
        default: "2s",
        help: "Silence after which a peer is declared failed: a tcp peer whose host stops answering (TCP_USER_TIMEOUT, keepalive probes), and on every transport a peer this side waits on (a request, a flush) that does not answer keepalive frames because it is stopped or no longer progresses ('inf': never); a flush waits on a peer twice this, 5 s to 60 s",
        accepts: "a duration no shorter than COURIER_KEEPALIVE_INTERVAL (a number with us, ms, s or m for minutes, e.g. 2s, 1500ms), or inf",
    },
    Var {
        name: "COURIER_SIGNAL_NAP",
        default: "1ms",
        help: "Longest sleep of a sleeping signal wait before it looks at the word again, for writes that wake no one (another thread, a peer's atomic; a put-with-signal wakes the waiting worker itself)",
        accepts: "a duration (a number with us, ms, s or m for minutes, e.g. 1ms, 200us); inf: only a wakeup ends the sleep",
    },
    Var {
        name: "COURIER_SHM_FIFO_SIZE",
        default: "1024",
        help: "Cells in each shared-memory FIFO (a power of two; 256 bytes each)",
        accepts: "a power of two from 16 to 65536",
    },
    Var {
        name: "COURIER_SHM_CMA",
        default: "auto",
        help: "Single-copy transfers with process_vm_readv: auto (probe), yes (required), no (bounce buffers)",
        accepts: "auto | yes | no (any case; also on/off, y/n, 1/0)",
    },
    Var {
        name: "COURIER_TCP_SNDBUF",
        default: "4m",
        help: "TCP send buffer size (0 keeps the system default; the kernel caps it at net.core.wmem_max)",
        accepts: "a size up to 2147483647 bytes (setsockopt takes an int), such as 4m",
    },
    Var {
        name: "COURIER_TCP_RCVBUF",
        default: "4m",
        help: "TCP receive buffer size of a link that carries bulk data (the kernel doubles it for its own overhead and caps the request at net.core.rmem_max; 0 keeps the system default and its tuning). Every link starts with at most 1m and grows to this once 4 MiB arrived on it in frames of 32 KiB or more: a peer that sends small segments faster than they are read keeps the buffer full, and the kernel then re-copies the whole queue as further segments arrive, inside this process's calls (calls of up to a quarter of a second measured with 4m from the start; bench/analysis.md)",
        accepts: "a size up to 2147483647 bytes (setsockopt takes an int), such as 4m",
    },
    Var {
        name: "COURIER_CUDA_LIB",
        default: "libcuda.so.1",
        help: "The CUDA driver library, loaded at run time when CUDA memory is used (or when the application has loaded it)",
        accepts: "a library name or path (no control characters)",
    },
    Var {
        name: "COURIER_CUDA_IPC_THRESH",
        default: "16k",
        help: "Tag messages from CUDA device memory of at least this size go to a same-host peer as an offer of the device memory itself, read by the peer through the allocation's IPC handle (device to device into device memory); smaller ones as a host copy, sent eagerly",
        accepts: "a size such as 0, 4k, 64k",
    },
    Var {
        name: "COURIER_CUDA_STAGING",
        default: "256m",
        help: "Most page-locked host memory a process keeps for copies of CUDA device memory (host copies of messages, bounce buffers); beyond it, host copies are ordinary memory and receives from host memory go through two bounce buffers (the last context created sets it for the process)",
        accepts: "a size such as 64m, 1g (0: ordinary memory only)",
    },
    Var {
        name: "COURIER_TCP_CONNECT_TIMEOUT",
        default: "5s",
        help: "How long a TCP connection attempt may take",
        accepts: "a duration above 0 (a number with us, ms, s or m for minutes, e.g. 5s), or inf",
    },
    Var {
        name: "COURIER_TCP_CONGESTION",
        default: "auto",
        help: "TCP congestion control: auto (reno for connections within this host, where no network is shared; the system's otherwise), system, or an algorithm for every connection",
        accepts: "auto | system | an algorithm name (reno, cubic, bbr, ...)",
    },
    Var {
        name: "COURIER_JOB_LAUNCHER",
        default: "auto",
        help: "Which launcher Job::init talks to: auto (courier run, then PMIx, PMI-2, PMI-1, else a job of one), run, pmix, pmi2, pmi1 or single",
        accepts: "auto | run | pmix | pmi2 | pmi1 | single",
    },
    Var {
        name: "COURIER_JOB_TIMEOUT",
        default: "120s",
        help: "How long Job::init waits for every rank at its start-up fence (under launchers that cannot say when a rank died before it, such as hydra), and JobWorld's default for fences and address lookups",
        accepts: "a duration above 0 (a number with us, ms, s or m for minutes, e.g. 120s)",
    },
    Var {
        name: "COURIER_PMIX_LIB",
        default: "libpmix.so.2",
        help: "The PMIx client library loaded at run time when mpirun or srun --mpi=pmix started the process",
        accepts: "a library name or path",
    },
    Var {
        name: "COURIER_RUN_FD",
        default: "none",
        help: "Set by courier run in each rank: the descriptor of the rank's socket to the launcher (not set by users)",
        accepts: "a descriptor number",
    },
    Var {
        name: "COURIER_RUN_RANK",
        default: "none",
        help: "Set by courier run in each rank: its rank, for scripts (programs use Job::rank)",
        accepts: "a number",
    },
    Var {
        name: "COURIER_RUN_SIZE",
        default: "none",
        help: "Set by courier run in each rank: the number of ranks, for scripts (programs use Job::size)",
        accepts: "a number",
    },
    Var {
        name: "COURIER_MAX_UNEXPECTED_EP",
        default: "32m",
        help: "Most bytes of tag messages (and rendezvous offers) one endpoint's peer may have waiting for a receive; a peer that sends more fails its endpoint with an error naming this limit",
        accepts: "a size of at least 64k, such as 32m",
    },
    Var {
        name: "COURIER_MAX_UNEXPECTED",
        default: "128m",
        help: "Most bytes that all peers of a worker together may have waiting for the application (unexpected tag messages and stream bytes not yet received); the endpoint whose message would pass it fails with an error naming this limit",
        accepts: "a size of at least 64k, such as 128m",
    },
    Var {
        name: "COURIER_MAX_STREAM_EP",
        default: "16m",
        help: "Most stream bytes one endpoint's peer may have sent that the application has not received yet; a peer that sends more fails its endpoint with an error naming this limit",
        accepts: "a size of at least 64k, such as 16m",
    },
    Var {
        name: "COURIER_MAX_REPLY_QUEUE",
        default: "16m",
        help: "Most memory of answers to one peer that does not read them: answers enter a link's send queue only while it holds less than this (later ones wait, a get's data staying in its region, and are served as the peer reads), and the waiting answers (get data copies, acknowledgements, queue entries) past it fail the endpoint with an error naming this limit; the answers failed endpoints leave, freed a batch per progress call, hold at most this much together (the oldest go at once)",
        accepts: "a size of at least 64k, such as 16m",
    },
    Var {
        name: "COURIER_MAX_RX_BUFFERED",
        default: "256m",
        help: "Most bytes the tcp links of a process may hold in receive buffers grown past their first 256k (frames not yet whole, that cannot be placed where they go); a link that needs more fails its endpoint with an error naming this limit",
        accepts: "a size of at least 16m, such as 256m",
    },
    Var {
        name: "COURIER_MAX_FRAME",
        default: "16m",
        help: "Largest frame this worker accepts from a peer; each side tells the other its value at wireup, and senders cut messages, rendezvous pieces and puts into frames no larger than the smaller of it and their transport's own (shm: 64k); a peer that sends a larger frame fails its endpoint with an error naming this limit",
        accepts: "a size from 4k to 16m, rounded down to a whole k, such as 1m",
    },
    Var {
        name: "COURIER_MAX_CONNECTING",
        default: "256",
        help: "Most accepted connections of a worker still in setup (not yet introduced); a new one beyond it pushes out the oldest",
        accepts: "a number from 1 to 1000000",
    },
    Var {
        name: "COURIER_MAX_ACCEPTED",
        default: "4096",
        help: "Most endpoints peers' connections may have made in one worker (through its address or its listeners); connections beyond it are refused",
        accepts: "a number from 1 to 1000000",
    },
    Var {
        name: "COURIER_MAX_ACCEPTED_LISTENER",
        default: "1024",
        help: "Most endpoints the connections accepted by one listener may have made; connections beyond it are refused",
        accepts: "a number from 1 to 1000000",
    },
];
