//! Authentication's secrets: the key (from `COURIER_AUTH_KEY_FILE` or the job), the mode
//! (`COURIER_AUTH`), fresh nonces from the kernel, and the keyed MAC (HMAC-SHA256) that each
//! side of a handshake proves it holds the key with, compared in constant time.
//!
//! The key never leaves this module: the handshake (`proto::wireup::auth`) asks for a proof
//! over both nonces and the role of the side that makes it, and for a check of the peer's
//! proof. The role is in the MAC, so a proof made by an acceptor can never pass as an
//! initiator's (a reflected challenge fails), and both nonces are in it, so a proof from an
//! earlier handshake never passes again.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::status::{Error, Result, Status};

/// Bytes of a nonce and of a proof.
pub const NONCE_LEN: usize = 32;
/// Bytes of a proof (HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// The shortest key accepted (128 bits).
pub const MIN_KEY_LEN: usize = 16;
/// The longest key file read.
const MAX_KEY_FILE: u64 = 4096;

/// `COURIER_AUTH`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// With a key, every peer must prove it; without one, only this host's peers are
    /// accepted (shm of the same user, tcp from this host).
    Auto,
    /// Every peer must prove it holds the key; no key is a configuration error.
    Required,
    /// No authentication: any peer that reaches the worker is accepted (warned once).
    Off,
}

impl AuthMode {
    /// Parse a `COURIER_AUTH` value.
    pub fn parse(s: &str) -> Option<AuthMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(AuthMode::Auto),
            "required" | "require" | "on" => Some(AuthMode::Required),
            "off" | "none" => Some(AuthMode::Off),
            _ => None,
        }
    }

    /// The name, as `COURIER_AUTH` takes it.
    pub fn name(self) -> &'static str {
        match self {
            AuthMode::Auto => "auto",
            AuthMode::Required => "required",
            AuthMode::Off => "off",
        }
    }
}

/// Which side of a handshake makes a proof: bound into the MAC.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// The side that opened the link.
    Initiator,
    /// The side that accepted it.
    Acceptor,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Initiator => b"initiator",
            Role::Acceptor => b"acceptor",
        }
    }
}

/// A shared secret key. Its bytes are never printed and are wiped when it is dropped.
pub struct Key {
    bytes: Vec<u8>,
    /// Where it came from, for logs and `courier info -c`.
    source: String,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.source)
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        for b in self.bytes.iter_mut() {
            // SAFETY: `b` is a valid, aligned, exclusive reference to a byte of the key;
            // the volatile write keeps the wipe from being optimised away.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

/// Domain separation of Courier's handshake MAC (and its version).
const MAC_CONTEXT: &[u8] = b"courier-auth-v1";

impl Key {
    /// A key from its bytes (at least `MIN_KEY_LEN`); `source` says where it came from.
    pub fn new(bytes: &[u8], source: &str) -> Result<Key> {
        if bytes.len() < MIN_KEY_LEN {
            return Err(Error::msg(
                Status::BadConfig,
                format!(
                    "authentication key from {source} is {} bytes: at least {MIN_KEY_LEN} are needed (make one with: head -c 32 /dev/urandom > FILE; chmod 600 FILE)",
                    bytes.len()
                ),
            ));
        }
        Ok(Key {
            bytes: bytes.to_vec(),
            source: source.to_string(),
        })
    }

    /// Where the key came from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The proof that `role` holds the key, over both nonces.
    pub fn proof(
        &self,
        role: Role,
        initiator_nonce: &[u8; NONCE_LEN],
        acceptor_nonce: &[u8; NONCE_LEN],
    ) -> [u8; PROOF_LEN] {
        // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
        let mut m = match Hmac::<Sha256>::new_from_slice(&self.bytes) {
            Ok(m) => m,
            Err(_) => return [0; PROOF_LEN],
        };
        m.update(MAC_CONTEXT);
        m.update(&[0]);
        m.update(role.label());
        m.update(&[0]);
        m.update(initiator_nonce);
        m.update(acceptor_nonce);
        m.finalize().into_bytes().into()
    }

    /// Whether `proof` is `role`'s proof over both nonces, compared in constant time.
    pub fn verify(
        &self,
        role: Role,
        initiator_nonce: &[u8; NONCE_LEN],
        acceptor_nonce: &[u8; NONCE_LEN],
        proof: &[u8; PROOF_LEN],
    ) -> bool {
        let want = self.proof(role, initiator_nonce, acceptor_nonce);
        bool::from(want.ct_eq(proof))
    }
}

/// Fill `out` from the kernel's random source; an error (never a weaker fallback) if it
/// cannot.
pub fn fill_random(out: &mut [u8], what: &str) -> Result<()> {
    let mut got = 0;
    while got < out.len() {
        match rustix::rand::getrandom(&mut out[got..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(Error::io(&format!("getrandom for {what}"), e)),
        }
    }
    Ok(())
}

/// A fresh nonce.
pub fn nonce() -> Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    fill_random(&mut n, "an authentication nonce")?;
    Ok(n)
}

/// Read the key from `path`, refusing (as ssh does) a file that is not a regular file of
/// this user's with no permission bits for group or others.
pub fn load_key_file(path: &Path) -> Result<Key> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let shown = path.display();
    let bad = |why: String| {
        Error::msg(
            Status::BadConfig,
            format!("COURIER_AUTH_KEY_FILE={shown}: {why}"),
        )
    };
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| bad(format!("cannot open it ({e})")))?;
    // Checked on the open file, so the file read is the file checked.
    let md = f
        .metadata()
        .map_err(|e| bad(format!("cannot stat it ({e})")))?;
    if !md.file_type().is_file() {
        return Err(bad("not a regular file".into()));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me {
        return Err(bad(format!(
            "owned by uid {}, not by this user (uid {me}): a key file must be the user's own",
            md.uid()
        )));
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(bad(format!(
            "permissions {mode:04o} are too open: group and others must have no access (run: chmod 600 {shown})"
        )));
    }
    if md.len() > MAX_KEY_FILE {
        return Err(bad(format!(
            "{} bytes: a key file holds at most {MAX_KEY_FILE}",
            md.len()
        )));
    }
    let mut bytes = Vec::with_capacity(md.len() as usize);
    (&mut f)
        .take(MAX_KEY_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(format!("cannot read it ({e})")))?;
    // A key written by `echo` ends with a newline; it is not part of the key.
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    let key = Key::new(&bytes, &format!("COURIER_AUTH_KEY_FILE={shown}"));
    for b in bytes.iter_mut() {
        // SAFETY: as in `Key::drop`: wipe the copy read from the file.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    key
}

/// The key of the job this process belongs to, when its launcher (`courier run`) handed
/// one over: every context of the process uses it when no key file is given.
static JOB_KEY: Mutex<Option<Arc<Key>>> = Mutex::new(None);

/// Remember the job's key (the job layer calls this once it has it).
pub fn set_job_key(bytes: &[u8], source: &str) -> Result<()> {
    let k = Arc::new(Key::new(bytes, source)?);
    *JOB_KEY.lock().unwrap_or_else(|p| p.into_inner()) = Some(k);
    Ok(())
}

/// The job's key, if a launcher handed one over.
pub fn job_key() -> Option<Arc<Key>> {
    JOB_KEY.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The key a context uses under `mode`: the key file's if one is named, else the job's;
/// `required` without either is an error that says how to give one.
pub fn resolve(mode: AuthMode, file: Option<&Path>) -> Result<Option<Arc<Key>>> {
    if mode == AuthMode::Off {
        return Ok(None);
    }
    let key = match file {
        Some(p) => Some(Arc::new(load_key_file(p)?)),
        None => job_key(),
    };
    if key.is_none() && mode == AuthMode::Required {
        return Err(Error::new(Status::BadConfig, HOW_TO_GIVE_A_KEY_REQUIRED));
    }
    Ok(key)
}

/// What `COURIER_AUTH` and `COURIER_AUTH_KEY_FILE` make of this process's connections, in
/// a line (`courier info -c`): the key in force, or why there is none.
pub fn in_force(mode: AuthMode, file: Option<&Path>) -> String {
    match (mode, resolve(mode, file)) {
        (AuthMode::Off, _) => {
            "off: any peer that reaches a worker is accepted, unauthenticated".into()
        }
        (m, Ok(Some(k))) => format!("{}: every peer proves it holds {}", m.name(), k.source()),
        (m, Ok(None)) => format!(
            "{}, no key: only this host's peers are accepted (shm of this user, tcp from this host)",
            m.name()
        ),
        (_, Err(e)) => format!("error: {}", e.detail()),
    }
}

const HOW_TO_GIVE_A_KEY_REQUIRED: &str = "COURIER_AUTH=required, but there is no authentication key: name a key file with COURIER_AUTH_KEY_FILE (the user's own, mode 0600; the same file on every host), or start the processes with `courier run`, which gives each job a key";

/// What a refusal of a peer from another host tells the user to do.
pub const HOW_TO_GIVE_A_KEY: &str = "a peer on another host must prove it holds the authentication key, and this process has none: give every process the same key file with COURIER_AUTH_KEY_FILE (mode 0600), or start them with `courier run`; or set COURIER_AUTH=off on trusted networks only";

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> Key {
        Key::new(&[b; 32], "test").unwrap()
    }

    #[test]
    fn proofs_bind_key_role_and_both_nonces() {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let k = key(7);
        let p = k.proof(Role::Initiator, &a, &b);
        assert!(k.verify(Role::Initiator, &a, &b, &p));
        assert!(!k.verify(Role::Acceptor, &a, &b, &p), "reflection");
        assert!(!k.verify(Role::Initiator, &b, &a, &p), "nonces swapped");
        assert!(!k.verify(Role::Initiator, &a, &[3; 32], &p), "other nonce");
        assert!(!key(8).verify(Role::Initiator, &a, &b, &p), "other key");
        for bit in 0..PROOF_LEN * 8 {
            let mut q = p;
            q[bit / 8] ^= 1 << (bit % 8);
            assert!(!k.verify(Role::Initiator, &a, &b, &q));
        }
    }

    #[test]
    fn short_keys_and_modes() {
        assert!(Key::new(&[1; 15], "t").is_err());
        assert_eq!(AuthMode::parse(" Required "), Some(AuthMode::Required));
        assert_eq!(AuthMode::parse("off"), Some(AuthMode::Off));
        assert_eq!(AuthMode::parse("maybe"), None);
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri emulates getuid (1000) while the file belongs to the real user"
    )]
    fn key_file_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("courier-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("key");
        std::fs::write(&p, b"0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_key_file(&p).unwrap_err().to_string();
        assert!(e.contains("too open") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let k = load_key_file(&p).unwrap();
        assert_eq!(k.bytes.len(), 32, "trailing newline dropped");
        std::fs::write(&p, b"short").unwrap();
        assert!(
            load_key_file(&p)
                .unwrap_err()
                .to_string()
                .contains("at least 16")
        );
        let e = load_key_file(&dir.join("missing")).unwrap_err().to_string();
        assert!(e.contains("cannot open"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
