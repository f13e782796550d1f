//! Core's modules form layers: no module reaches, through `crate::` paths, a
//! module that reaches it back. A module and its own submodules may use each
//! other (they are one unit); unit tests (`mod tests`) are not counted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`transport::session::bulk`) -> source, for every file of `src`.
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
                Some(at) => source[..at].to_string(),
                None => source,
            };
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
                if !item.is_empty() {
                    paths.push(format!("{head}::{item}"));
                }
            }
        }
        paths.push(head);
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
