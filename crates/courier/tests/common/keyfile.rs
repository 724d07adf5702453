//! A key file for `COURIER_AUTH_KEY_FILE` (auth.rs, max_frame.rs): `bytes` with `mode`, in a
//! directory of its own that is removed on drop.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

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
