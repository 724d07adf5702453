//! Parent and child as peers: transports, memory, and connecting with the keys passed.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier::*;

use super::child::{DEADLINE, EXIT, Kid, progress_until, send_u64, serve_one};
use super::{keys_hex, keys_unhex};

/// A test file's transport selection: the settings given to both sides, as a context's
/// configuration and in the child's environment.
pub trait Transport: Copy + std::fmt::Debug {
    fn env(self) -> Vec<(&'static str, String)>;
}

/// A context with one-sided operations on `net`; `wakeup` for sleeping waits.
pub fn ctx_with(net: impl Transport, wakeup: bool) -> Context {
    let f = Features {
        rma: true,
        atomics: true,
        wakeup,
        ..Default::default()
    };
    let mut p = ContextParams::default().features(f);
    for (k, v) in net.env() {
        p = p.config(k, &v);
    }
    Context::new(p).unwrap()
}

pub fn ctx(net: impl Transport) -> Context {
    ctx_with(net, true)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mem {
    /// `MemMapParams::allocate`: a shared segment, mapped by same-host peers.
    Alloc,
    /// `MemMapParams::register` of the test's own buffer.
    Reg,
}

impl Mem {
    /// As in `COURIER_TEST_MEM`.
    pub fn name(self) -> &'static str {
        match self {
            Mem::Alloc => "alloc",
            Mem::Reg => "reg",
        }
    }
    pub fn from_env() -> Mem {
        match std::env::var("COURIER_TEST_MEM").unwrap().as_str() {
            "alloc" => Mem::Alloc,
            _ => Mem::Reg,
        }
    }
}

/// A mapped region of either kind; the registered buffer outlives its mapping.
pub struct Region {
    pub mem: Memory,
    _backing: Option<Vec<u64>>,
}

impl Region {
    pub fn new(c: &Context, kind: Mem, len: usize, acc: u16) -> Region {
        match kind {
            Mem::Alloc => Region {
                mem: c.mem_map(MemMapParams::allocate(len).access(acc)).unwrap(),
                _backing: None,
            },
            Mem::Reg => {
                // u64s: the words atomics and signals use must be aligned.
                let mut b = vec![0u64; len.div_ceil(8)];
                let mem = c
                    .mem_map(
                        // SAFETY: `b` is kept in the Region beside `mem` and dropped after it; the
                        // test reads it only through the Memory.
                        unsafe { MemMapParams::register(b.as_mut_ptr() as *mut u8, len) }
                            .access(acc),
                    )
                    .unwrap();
                Region {
                    mem,
                    _backing: Some(b),
                }
            }
        }
    }
    pub fn key(&self) -> Vec<u8> {
        self.mem.pack_rkey().unwrap()
    }
    pub fn len(&self) -> usize {
        self.mem.len()
    }
    /// The region's bytes. Callers look only while no peer writes them.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: our own live region.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr(), self.len()) }
    }
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len());
        // SAFETY: inside our own live region.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.mem.as_ptr().add(off), data.len())
        };
    }
    /// `n` bytes at `off`. Callers look only while no peer writes them.
    pub fn at(&self, off: usize, n: usize) -> &[u8] {
        &self.bytes()[off..off + n]
    }
    pub fn word(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.len());
        // SAFETY: aligned (regions start on pages or u64 buffers), inside the region.
        unsafe { AtomicU64::from_ptr(self.mem.as_ptr().add(off) as *mut u64) }
    }
}

/// A listener on a free loopback port that accepts every peer; the endpoints, in order.
pub fn listen(w: &Worker) -> (Listener, Arc<Mutex<Vec<Endpoint>>>) {
    let eps: Arc<Mutex<Vec<Endpoint>>> = Arc::default();
    let e2 = eps.clone();
    let l = Listener::new(w, "127.0.0.1:0".parse().unwrap(), move |r: ConnRequest| {
        if let Ok(ep) = r.accept(EndpointParams::default()) {
            e2.lock().unwrap().push(ep);
        }
    })
    .unwrap();
    (l, eps)
}

/// Connect to the listener on loopback `port` (not waiting for it), as client `id`.
pub fn dial(w: &Worker, port: u16, id: u64) -> Endpoint {
    w.connect_sockaddr(([127, 0, 0, 1], port).into(), id, EndpointParams::default())
        .unwrap()
}

/// In a child: the parent's port, `COURIER_TEST_PORT`.
pub fn port_from_env() -> u16 {
    std::env::var("COURIER_TEST_PORT").unwrap().parse().unwrap()
}

/// In a child: the packed keys the parent passed, `COURIER_TEST_KEYS`.
pub fn keys_from_env() -> Vec<Vec<u8>> {
    keys_unhex(&std::env::var("COURIER_TEST_KEYS").unwrap())
}

// ----- the parent owns the memory -----------------------------------------------------------

/// The parent as owner: a worker with a listener that accepts every child.
pub struct Owner {
    pub c: Context,
    pub w: Worker,
    _l: Listener,
    pub eps: Arc<Mutex<Vec<Endpoint>>>,
    pub port: u16,
}

impl Owner {
    pub fn new(net: impl Transport) -> Owner {
        Owner::on(ctx(net))
    }

    /// The owner with a context of the caller's.
    pub fn on(c: Context) -> Owner {
        let w = Worker::new(&c, WorkerParams::default()).unwrap();
        let (l, eps) = listen(&w);
        let port = l.local_addr().port();
        Owner {
            c,
            w,
            _l: l,
            eps,
            port,
        }
    }

    /// Start a child acting on `keys`.
    pub fn spawn(
        &self,
        role: &str,
        net: impl Transport,
        keys: &[Vec<u8>],
        env: &[(&str, String)],
    ) -> Kid {
        let mut all = vec![
            ("COURIER_TEST_PORT", self.port.to_string()),
            ("COURIER_TEST_KEYS", keys_hex(keys)),
        ];
        all.extend(env.iter().map(|(k, v)| (*k, v.clone())));
        Kid::spawn(role, net, &all)
    }

    /// The endpoint of the first child that connected.
    pub fn ep(&self, kid: &mut Kid) -> Endpoint {
        progress_until(&self.w, kid, "the child to connect", || {
            !self.eps.lock().unwrap().is_empty()
        });
        self.eps.lock().unwrap()[0].clone()
    }
}

/// A child acting on the parent's memory: connected, with the keys unpacked.
pub struct Actor<N> {
    _c: Context,
    pub w: Worker,
    pub ep: Endpoint,
    pub raw: Vec<Vec<u8>>,
    pub rk: Vec<RemoteKey>,
    pub net: N,
}

/// In a child of [`Owner::spawn`]: connect over `net` and unpack the keys.
pub fn actor<N: Transport>(net: N) -> Actor<N> {
    let port = port_from_env();
    let raw = keys_from_env();
    let c = ctx(net);
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    let ep = dial(&w, port, std::process::id() as u64);
    ep.wait_connected(Duration::from_secs(10)).unwrap();
    let rk = raw.iter().map(|k| ep.rkey_unpack(k).unwrap()).collect();
    Actor {
        _c: c,
        w,
        ep,
        raw,
        rk,
        net,
    }
}

// ----- a child owns the memory --------------------------------------------------------------

/// A child that is the target: it listens, prints `PORT` and then `KEYS` on stdout, and
/// progresses while it waits for what the parent does.
pub struct Target {
    pub c: Context,
    pub w: Worker,
    _l: Listener,
    eps: Arc<Mutex<Vec<Endpoint>>>,
    deadline: Instant,
}

/// In a child started with [`Kid::spawn`]: listen over `net` and print the port.
pub fn target(net: impl Transport) -> Target {
    let c = ctx(net);
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    let (l, eps) = listen(&w);
    println!("PORT {}", l.local_addr().port());
    Target {
        c,
        w,
        _l: l,
        eps,
        deadline: Instant::now() + DEADLINE,
    }
}

impl Target {
    pub fn publish(&self, keys: &[Vec<u8>]) {
        println!("KEYS {}", keys_hex(keys));
    }
    /// The parent's endpoint, once it has connected.
    pub fn ep(&self) -> Endpoint {
        while self.eps.lock().unwrap().is_empty() {
            self.w.progress();
            assert!(Instant::now() < self.deadline, "the parent did not connect");
        }
        self.eps.lock().unwrap()[0].clone()
    }
    pub fn recv_u64(&self, tag: u64) -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { self.w.tag_recv_nb(&mut b, tag, u64::MAX) }.unwrap();
        while !r.is_done() {
            self.w.progress();
            assert!(
                Instant::now() < self.deadline,
                "no message {tag:#x} from the parent"
            );
        }
        r.wait().unwrap();
        u64::from_le_bytes(b)
    }
}

/// The parent as client of a target child: connected, with the child's keys.
pub struct Client {
    _c: Context,
    pub w: Worker,
    pub ep: Endpoint,
    pub raw: Vec<Vec<u8>>,
    pub rk: Vec<RemoteKey>,
}

/// Connect over `net` to the target `kid` and unpack its keys.
pub fn client(kid: &mut Kid, net: impl Transport) -> Client {
    let port: u16 = kid.line("PORT").parse().unwrap();
    let raw = keys_unhex(&kid.line("KEYS"));
    let c = ctx(net);
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    let ep = dial(&w, port, std::process::id() as u64);
    progress_until(&w, kid, "the connection", || ep.is_connected().unwrap());
    let rk = raw.iter().map(|k| ep.rkey_unpack(k).unwrap()).collect();
    Client {
        _c: c,
        w,
        ep,
        raw,
        rk,
    }
}

impl Client {
    /// Tell the child to finish; wait until it has, and return its stderr.
    pub fn finish(&self, kid: &mut Kid) -> String {
        self.ep.flush().unwrap();
        send_u64(&self.ep, EXIT, 0);
        serve_one(&self.w, kid)
    }
}
