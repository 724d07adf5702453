//! Builds the stand-in CUDA driver (`mockcuda.c` beside this file) with the system C
//! compiler, for tests that need device memory on machines without a GPU. Shared by the
//! library's and the command's tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Build `libcuda.so.1` from `mockcuda.c` into `dir`; its path.
pub fn build(dir: &Path) -> String {
    let src = PathBuf::from(file!())
        .parent()
        .map(|d| d.join("mockcuda.c"))
        .unwrap();
    // `file!()` is relative to the workspace root; tests run in their crate's directory.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let src = root
        .ancestors()
        .map(|a| a.join(&src))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("mockcuda.c not found from {}", root.display()));
    std::fs::create_dir_all(dir).unwrap();
    let out = dir.join("libcuda.so.1");
    // Built under a name of its own, then renamed into place: test binaries running at
    // the same time each replace the file whole (a process that loaded it keeps its copy).
    let tmp = dir.join(format!("libcuda.so.1.{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&tmp)
        .arg(&src)
        .arg("-lpthread")
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
    assert!(st.success(), "building the stand-in CUDA driver failed");
    std::fs::rename(&tmp, &out).unwrap();
    out.to_string_lossy().into_owned()
}
