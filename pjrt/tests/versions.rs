//! Plugins this layer must refuse without crashing: another PJRT major
//! version, a minor version older than the oldest accepted, and a table
//! whose entries are empty. The plugins are tiny C libraries built here with
//! `cc`, exporting `GetPjrtApi` with the version under test.

use std::path::{Path, PathBuf};
use std::process::Command;

use colocated_pjrt::{Code, Plugin, MIN_API_MINOR};

/// A library whose `GetPjrtApi` returns a table of `struct_size` bytes that
/// says version `major.minor` and holds no entries.
fn fake_plugin(dir: &Path, name: &str, major: i32, minor: i32) -> PathBuf {
    let source = dir.join(format!("{name}.c"));
    std::fs::write(
        &source,
        format!(
            r#"#include <stddef.h>
#include <string.h>
struct version {{ size_t struct_size; void *extension_start; int major_version; int minor_version; }};
struct api {{ size_t struct_size; void *extension_start; struct version pjrt_api_version; void *entries[200]; }};
static struct api table;
const struct api *GetPjrtApi(void) {{
  memset(&table, 0, sizeof table);
  table.struct_size = sizeof table;
  table.pjrt_api_version.struct_size = sizeof(struct version);
  table.pjrt_api_version.major_version = {major};
  table.pjrt_api_version.minor_version = {minor};
  return &table;
}}
"#
        ),
    )
    .unwrap();
    let library = dir.join(format!("lib{name}.so"));
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .expect("a C compiler (cc)");
    assert!(status.success(), "cc failed");
    library
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("colocated-pjrt-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_plugin_of_another_major_or_too_old_a_minor_is_refused() {
    let dir = temp_dir("versions");
    let major = Plugin::load(&fake_plugin(&dir, "major1", 1, 0))
        .err()
        .unwrap();
    assert_eq!(major.code(), Code::FailedPrecondition);
    assert!(major.message().contains("PJRT API 1.0"), "{major}");
    let old = Plugin::load(&fake_plugin(&dir, "minor40", 0, 40))
        .err()
        .unwrap();
    assert_eq!(old.code(), Code::FailedPrecondition);
    assert!(old.message().contains("0.40"), "{old}");
    assert!(
        old.message().contains(&format!("0.{MIN_API_MINOR}")),
        "{old}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_plugin_whose_table_is_empty_gets_unimplemented_not_a_crash() {
    let dir = temp_dir("empty");
    let e = Plugin::load(&fake_plugin(&dir, "empty", 0, 90))
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::Unimplemented);
    assert!(e.message().contains("PJRT_Plugin_Initialize"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
