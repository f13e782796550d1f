//! Builds C plugin sources into shared libraries for the Rust tests of the
//! plugin loader (`plugin/tests/plugin.rs`, `cli/tests/worker.rs`), which include
//! this file with `#[path]`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's top directory (the tests' crates sit one level below).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Compiles the C `source` into the plugin library `dir/lib{name}.so`, against
/// the checked-in header.
pub fn compile_plugin(dir: &Path, name: &str, source: &Path) -> PathBuf {
    let out = dir.join(format!("lib{name}.so"));
    let output = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args([
            "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I",
        ])
        .arg(workspace().join("include"))
        .arg(source)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "compiling {}: {}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    out
}
