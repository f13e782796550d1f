//! Core's modules form layers, and a test enforces them:
//!
//! - every top-level module sits in one layer of the table in
//!   `docs/architecture.md` ("Core's modules, in layers"), the one place the
//!   layers are written down;
//! - no module names (through `crate::` or `super::` paths, outside comments
//!   and unit tests) a module of a higher layer;
//! - top-level modules import each other in no cycle, and neither do files.
//!
//! A module and its own submodules may use each other (they are one unit).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`session::bulk`) -> source, for every file of `src`.
fn modules(root: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable") {
            let path = entry.expect("src is readable").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path
                .strip_prefix(root)
                .expect("under src")
                .with_extension("");
            let name = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("::");
            let name = name.strip_suffix("::mod").unwrap_or(&name).to_string();
            if name == "lib" {
                continue;
            }
            let source = std::fs::read_to_string(&path).expect("source is UTF-8");
            // Unit tests sit at the end of a file and may use anything.
            let source = match source.find("#[cfg(test)]\nmod tests") {
                Some(at) => &source[..at],
                None => &source,
            };
            // Comments (doc links included) import nothing.
            let source: String = source
                .lines()
                .map(|l| {
                    if l.trim_start().starts_with("//") {
                        ""
                    } else {
                        l
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            found.insert(name, source);
        }
    }
    found
}

/// The paths a source names after `crate::`, with `{a, b::c}` groups expanded.
fn crate_paths(source: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for (at, _) in source.match_indices("crate::") {
        let rest = &source[at + "crate::".len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let head = rest[..end].trim_end_matches(':').to_string();
        if rest[end..].starts_with('{') {
            let close = rest[end..].find('}').map_or(rest.len(), |i| end + i);
            for item in rest[end + 1..close].split(',') {
                let item = item.split(" as ").next().unwrap_or("").trim();
                if item.is_empty() {
                    continue;
                }
                if head.is_empty() {
                    paths.push(item.to_string());
                } else {
                    paths.push(format!("{head}::{item}"));
                }
            }
        }
        if !head.is_empty() {
            paths.push(head);
        }
    }
    paths
}

/// A depth-first search from `node`: the first cycle it meets, as a path.
fn find_cycle<'a>(
    node: &'a str,
    edges: &'a BTreeMap<String, BTreeSet<String>>,
    path: &mut Vec<&'a str>,
    done: &mut BTreeSet<&'a str>,
) -> Option<Vec<String>> {
    if let Some(at) = path.iter().position(|n| *n == node) {
        let mut cycle: Vec<String> = path[at..].iter().map(|s| s.to_string()).collect();
        cycle.push(node.to_string());
        return Some(cycle);
    }
    if done.contains(node) {
        return None;
    }
    path.push(node);
    for next in edges.get(node).into_iter().flatten() {
        if let Some(cycle) = find_cycle(next, edges, path, done) {
            return Some(cycle);
        }
    }
    path.pop();
    done.insert(node);
    None
}

#[test]
fn core_modules_have_no_import_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&root);
    assert!(modules.len() > 20, "modules found: {:?}", modules.keys());
    let resolve = |path: &str| -> Option<String> {
        let segments: Vec<&str> = path.split("::").collect();
        (1..=segments.len())
            .rev()
            .map(|n| segments[..n].join("::"))
            .find(|candidate| modules.contains_key(candidate))
    };
    let related = |a: &str, b: &str| {
        a == b || a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"))
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, source) in &modules {
        let targets = crate_paths(source)
            .iter()
            .filter_map(|p| resolve(p))
            .filter(|t| !related(name, t))
            .collect();
        edges.insert(name.clone(), targets);
    }
    let mut done = BTreeSet::new();
    for name in edges.keys() {
        if let Some(cycle) = find_cycle(name, &edges, &mut Vec::new(), &mut done) {
            panic!(
                "core's modules import each other in a cycle: {} (a lower layer must not name a higher one)",
                cycle.join(" -> ")
            );
        }
    }
}

/// The layers of `docs/architecture.md`'s table, low to high: (name, top-level
/// modules).
fn documented_layers() -> Vec<(String, Vec<String>)> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md");
    let doc = std::fs::read_to_string(&doc).expect("docs/architecture.md is readable");
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Core's modules, in layers"))
        .expect("docs/architecture.md has the section \"Core's modules, in layers\"");
    let mut layers = Vec::new();
    for row in section.lines().filter(|l| l.starts_with("| ")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (name, modules) = (cells[1], cells[2]);
        if name == "Layer" || name.starts_with("---") {
            continue;
        }
        let modules = modules
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        layers.push((name.to_string(), modules));
    }
    assert!(layers.len() >= 5, "the layers table: {layers:?}");
    layers
}

/// Names that `lib.rs` re-exports at the crate root -> the top-level module
/// they come from (`crate::Client` is `client`'s).
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    for (at, _) in lib.match_indices("pub use ") {
        let rest = &lib[at + "pub use ".len()..];
        let statement = &rest[..rest.find(';').unwrap_or(rest.len())];
        let Some((module, names)) = statement.split_once("::") else {
            continue;
        };
        let names = names.trim_start_matches('{').trim_end_matches('}');
        for name in names.split(',') {
            let name = name.split("::").last().unwrap_or("").trim();
            if !name.is_empty() {
                found.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    found
}

/// The top-level modules `source` (of module `module`) names through `crate::` and `super::` paths, with the line of each; code
/// only: comment lines are skipped.
fn top_level_imports(
    module: &[String],
    source: &str,
    reexports: &BTreeMap<String, String>,
) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (number, line) in source.lines().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        let mut paths = crate_paths(line);
        // Each `super::` goes one module up from the file's own (a `mod.rs`
        // is its directory's module).
        let mut rest = line;
        while let Some(at) = rest.find("super::") {
            let preceded = rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            let mut tail = &rest[at..];
            rest = &rest[at + "super::".len()..];
            if preceded {
                continue;
            }
            let mut base: Vec<String> = module.to_vec();
            while let Some(t) = tail.strip_prefix("super::") {
                base.pop();
                tail = t;
            }
            if base.is_empty() {
                paths.extend(crate_paths(&format!("crate::{tail}")));
            } else {
                paths.push(base.join("::"));
            }
        }
        for path in paths {
            let first = path.split("::").next().unwrap_or("");
            let first = reexports.get(first).map_or(first, String::as_str);
            if !first.is_empty() && first != module[0] {
                found.push((first.to_string(), number + 1));
            }
        }
    }
    found
}

#[test]
fn core_modules_import_only_their_own_and_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(root.join("lib.rs")).expect("lib.rs is readable");
    let reexports = reexports(&lib);
    let layers = documented_layers();
    let layer_of: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, (_, modules))| modules.iter().map(move |m| (m.as_str(), i)))
        .collect();
    let modules = modules(&root);
    let top_level: BTreeSet<&str> = modules
        .keys()
        .map(|m| m.split("::").next().unwrap_or(""))
        .collect();
    let unplaced: Vec<&&str> = top_level
        .iter()
        .filter(|m| !layer_of.contains_key(**m))
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules in no layer of docs/architecture.md: {unplaced:?}"
    );
    let gone: Vec<&&str> = layer_of
        .keys()
        .filter(|m| !top_level.contains(**m))
        .collect();
    assert!(gone.is_empty(), "layers list modules core lacks: {gone:?}");

    let mut upward = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, source) in &modules {
        let path: Vec<String> = name.split("::").map(str::to_string).collect();
        let file = name.replace("::", "/");
        let is_mod_rs = root.join(&file).join("mod.rs").exists();
        let from = path[0].as_str();
        for (to, line) in top_level_imports(&path, source, &reexports) {
            let Some(&to_layer) = layer_of.get(to.as_str()) else {
                continue;
            };
            if to_layer > layer_of[from] {
                let shown = if is_mod_rs {
                    format!("{file}/mod.rs")
                } else {
                    format!("{file}.rs")
                };
                upward.push(format!(
                    "core/src/{shown}:{line}: `{from}` ({}) imports `{to}` ({})",
                    layers[layer_of[from]].0, layers[to_layer].0
                ));
            }
            edges.entry(from.to_string()).or_default().insert(to);
        }
    }
    assert!(
        upward.is_empty(),
        "imports against core's layers (docs/architecture.md):\n{}",
        upward.join("\n")
    );
    let mut done = BTreeSet::new();
    for name in edges.keys() {
        if let Some(cycle) = find_cycle(name, &edges, &mut Vec::new(), &mut done) {
            panic!(
                "core's top-level modules import each other in a cycle: {}",
                cycle.join(" -> ")
            );
        }
    }
}

#[test]
fn the_layer_check_sees_crate_super_and_reexported_paths() {
    let reexports = BTreeMap::from([("Client".to_string(), "client".to_string())]);
    let module = ["buffer".to_string(), "host".to_string()];
    let source = "use crate::{array::Array, Client};\n\
                  // use crate::compiler::CompileOptions;\n\
                  use super::super::executor::Languages;\n\
                  use super::local::Local;\n";
    let found = top_level_imports(&module, source, &reexports);
    assert_eq!(
        found,
        [
            ("array".to_string(), 1),
            ("client".to_string(), 1),
            ("executor".to_string(), 3)
        ]
    );
    let mod_rs = ["worker".to_string()];
    let found = top_level_imports(&mod_rs, "use super::buffer::Buffer;", &reexports);
    assert_eq!(found, [("buffer".to_string(), 1)]);
}
