//! What auth.rs and max_frame.rs share: a key file for `COURIER_AUTH_KEY_FILE`, their two
//! transports (each with `self`, so a process reaches itself), and the child's announcement
//! of its worker (its packed address and its tcp address, for raw connections), and the
//! pieces of a hostile peer on a raw, authenticated tcp connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use courier::Worker;
use courier::auth::{Key, Role};
use courier::wire::address::WorkerAddress;
use courier::wire::auth::AuthMsg;
use courier::wire::frame::{Header, Kind};

use super::{Transport, hex};

/// Shared memory or tcp between the parent and its child.
#[derive(Clone, Copy, Debug)]
pub enum Net {
    Shm,
    Tcp,
}

impl Transport for Net {
    fn env(self) -> Vec<(&'static str, String)> {
        let tls = match self {
            Net::Shm => "shm,self",
            Net::Tcp => "tcp,self",
        };
        vec![("COURIER_TLS", tls.into())]
    }
}

/// Print `ADDR <hex of the packed address>` and `TCP <first tcp address, or nothing>`.
pub fn announce(w: &Worker) {
    let addr = w.address().unwrap();
    println!("ADDR {}", hex(&addr));
    let tcp = WorkerAddress::unpack(&addr)
        .unwrap()
        .tcp
        .first()
        .map(|a| a.to_string())
        .unwrap_or_default();
    println!("TCP {tcp}");
    std::io::stdout().flush().unwrap();
}

/// A key file of `bytes` with `mode`, in a directory of its own (removed on drop).
pub struct KeyFile {
    dir: PathBuf,
    pub path: PathBuf,
}

impl KeyFile {
    /// `name` tells this key's directory from the others of the same process and thread.
    pub fn new(name: &str, bytes: &[u8], mode: u32) -> KeyFile {
        let dir = std::env::temp_dir().join(format!(
            "courier-key-test-{}-{name}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        KeyFile { dir, path }
    }

    /// The environment entry that names it.
    pub fn env(&self) -> (&'static str, String) {
        ("COURIER_AUTH_KEY_FILE", self.path.display().to_string())
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ----- a peer on a raw tcp socket ----------------------------------------------------------

pub fn frame(b: &[u8]) -> Vec<u8> {
    let mut v = (b.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(b);
    v
}

pub fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut b = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// A raw tcp connection to the child's worker, authenticated with `key` (its preamble sent,
/// the handshake done).
pub fn raw_authenticated(to: SocketAddr, key: &[u8]) -> TcpStream {
    let key = Key::new(key, "test").unwrap();
    let mut s = TcpStream::connect(to).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"COURIER\x01").unwrap();
    let mine = [0x5a; 32];
    s.write_all(&frame(&AuthMsg::Hello { nonce: mine }.emit()))
        .unwrap();
    let ch = read_frame(&mut s).unwrap();
    let AuthMsg::Challenge { nonce, proof } = AuthMsg::parse(&ch).unwrap() else {
        panic!("no challenge: {ch:?}");
    };
    assert!(key.verify(Role::Acceptor, &mine, &nonce, &proof));
    let p = key.proof(Role::Initiator, &mine, &nonce);
    s.write_all(&frame(&AuthMsg::Response { proof: p }.emit()))
        .unwrap();
    s
}

/// A wireup frame's body from a made-up worker `worker_id` on another host: what turns an
/// authenticated raw connection into an endpoint of the child.
pub fn fake_wireup(worker_id: u64) -> Vec<u8> {
    let fake = WorkerAddress {
        worker_id,
        host_id: [0xee; 16],
        pid: 1,
        uds_name: vec![],
        tcp: vec![],
        max_frame_k: 0,
    };
    let mut wireup = Header::new(Kind::Wireup).as_bytes().to_vec();
    wireup.extend(fake.pack());
    wireup
}

/// Whether the child closed `s` (read returns 0, or the connection is reset).
pub fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 512];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue, // a REJECT, said before the close
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}
