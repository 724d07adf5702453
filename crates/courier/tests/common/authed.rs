//! What auth.rs and max_frame.rs share: a key file for `COURIER_AUTH_KEY_FILE`, their two
//! transports (each with `self`, so a process reaches itself), and the child's announcement
//! of its worker (its packed address and its tcp address, for raw connections).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use courier::Worker;
use courier::wire::address::WorkerAddress;

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
