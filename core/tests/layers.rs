//! Core's modules form layers, and a test enforces them:
//!
//! - every top-level module sits in one layer of the table in
//!   `docs/architecture.md` ("Core's modules, in layers"), the one place the
//!   layers are written down;
//! - no module names a module of a higher layer: every path of its code (in
//!   `use` items, however nested or wrapped, and in expressions and types)
//!   that starts with `crate`, `super` or `self` is resolved, crate-root
//!   re-exports to the module they come from;
//! - top-level modules import each other in no cycle.
//!
//! Sources are parsed with `syn`, so comments count for nothing; unit tests
//! (`#[cfg(test)]` items, and the `tests` modules they declare) may use
//! anything. A module and its own submodules may use each other (they are one
//! unit).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use syn::visit::Visit;

/// Module path (`["session", "bulk"]`) -> (its file under `src`, parsed),
/// for every file of `src` but `lib.rs` and unit-test files (`tests.rs`,
/// `tests/`).
fn modules(root: &Path) -> BTreeMap<Vec<String>, (String, syn::File)> {
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
            let mut name: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if name.last().is_some_and(|n| n == "mod") {
                name.pop();
            }
            if name == ["lib"] || name.iter().any(|n| n == "tests") {
                continue;
            }
            let source = std::fs::read_to_string(&path).expect("source is UTF-8");
            let file = syn::parse_file(&source)
                .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
            let shown = path
                .strip_prefix(root)
                .expect("under src")
                .display()
                .to_string();
            found.insert(name, (shown, file));
        }
    }
    found
}

/// Whether `attrs` hold `#[cfg(test)]`.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Ident>()
                .is_ok_and(|ident| ident == "test")
    })
}

/// The attributes of an item (none for the kinds that have none).
fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match item {
        Const(i) => &i.attrs,
        Enum(i) => &i.attrs,
        ExternCrate(i) => &i.attrs,
        Fn(i) => &i.attrs,
        ForeignMod(i) => &i.attrs,
        Impl(i) => &i.attrs,
        Macro(i) => &i.attrs,
        Mod(i) => &i.attrs,
        Static(i) => &i.attrs,
        Struct(i) => &i.attrs,
        Trait(i) => &i.attrs,
        TraitAlias(i) => &i.attrs,
        Type(i) => &i.attrs,
        Union(i) => &i.attrs,
        Use(i) => &i.attrs,
        _ => &[],
    }
}

/// Collects the paths a file names from its crate (`crate::`, `super::`,
/// `self::`), resolved against the file's module, outside `#[cfg(test)]`
/// items: each as the crate's path segments (`["buffer", "Buffer"]`).
struct CratePaths<'a> {
    module: &'a [String],
    found: Vec<Vec<String>>,
}

impl CratePaths<'_> {
    /// `segments` (as written) from the crate's root, when they start with
    /// `crate`, `super` or `self`.
    fn resolve(&mut self, segments: Vec<String>) {
        let mut base: Vec<String> = match segments.first().map(String::as_str) {
            Some("crate") => Vec::new(),
            Some("super") | Some("self") => self.module.to_vec(),
            _ => return,
        };
        let mut rest = segments.as_slice();
        if rest[0] == "crate" {
            rest = &rest[1..];
        }
        while let Some(first) = rest.first() {
            match first.as_str() {
                "super" => {
                    base.pop();
                }
                "self" => {}
                _ => break,
            }
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        self.found.push(base);
    }

    /// Every leaf of a `use` tree under `prefix`.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                if n.ident != "self" {
                    path.push(n.ident.to_string());
                }
                self.resolve(path);
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                if r.ident != "self" {
                    path.push(r.ident.to_string());
                }
                self.resolve(path);
            }
            syn::UseTree::Glob(_) => self.resolve(prefix.clone()),
            syn::UseTree::Group(g) => {
                for item in &g.items {
                    self.use_tree(prefix, item);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for CratePaths<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.resolve(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
}

/// The crate paths `file` (of module `module`) names.
fn crate_paths(module: &[String], file: &syn::File) -> Vec<Vec<String>> {
    let mut visitor = CratePaths {
        module,
        found: Vec::new(),
    };
    visitor.visit_file(file);
    visitor.found
}

/// Names that `lib.rs` re-exports at the crate root -> the top-level module
/// they come from (`Client` is `client`'s, `host_object` is `languages`').
fn reexports(lib: &syn::File) -> BTreeMap<String, String> {
    fn leaves(tree: &syn::UseTree, top: Option<&str>, found: &mut BTreeMap<String, String>) {
        match tree {
            syn::UseTree::Path(p) => {
                let name = p.ident.to_string();
                leaves(&p.tree, Some(top.unwrap_or(&name)), found);
            }
            syn::UseTree::Name(n) => {
                if let Some(top) = top {
                    found.insert(n.ident.to_string(), top.to_string());
                }
            }
            syn::UseTree::Rename(r) => {
                if let Some(top) = top {
                    found.insert(r.rename.to_string(), top.to_string());
                }
            }
            syn::UseTree::Glob(_) => {}
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| leaves(t, top, found)),
        }
    }
    let mut found = BTreeMap::new();
    for item in &lib.items {
        if let syn::Item::Use(u) = item {
            leaves(&u.tree, None, &mut found);
        }
    }
    found
}

/// The top-level module each of `module`'s crate paths names (other than
/// its own), with crate-root re-exports resolved.
fn top_level_imports(
    module: &[String],
    file: &syn::File,
    reexports: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    crate_paths(module, file)
        .into_iter()
        .filter_map(|path| path.into_iter().next())
        .map(|first| reexports.get(&first).cloned().unwrap_or(first))
        .filter(|first| *first != module[0])
        .collect()
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
fn core_modules_import_only_their_own_and_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(root.join("lib.rs")).expect("lib.rs is readable");
    let reexports = reexports(&syn::parse_file(&lib).expect("lib.rs parses"));
    let layers = documented_layers();
    let layer_of: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, (_, modules))| modules.iter().map(move |m| (m.as_str(), i)))
        .collect();
    let modules = modules(&root);
    assert!(modules.len() > 40, "modules found: {}", modules.len());
    let top_level: BTreeSet<&str> = modules.keys().map(|m| m[0].as_str()).collect();
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
    for (module, (shown, file)) in &modules {
        let from = module[0].as_str();
        for to in top_level_imports(module, file, &reexports) {
            let Some(&to_layer) = layer_of.get(to.as_str()) else {
                continue;
            };
            if to_layer > layer_of[from] {
                upward.push(format!(
                    "core/src/{shown}: `{from}` ({}) imports `{to}` ({})",
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
fn the_layer_check_sees_every_form_of_a_crate_path() {
    let lib = syn::parse_file(
        "pub use client::Client;\n\
         pub use languages::colocated::{host_object, Built as Made};",
    )
    .unwrap();
    let reexports = reexports(&lib);
    assert_eq!(reexports["Client"], "client");
    assert_eq!(reexports["host_object"], "languages");
    assert_eq!(reexports["Made"], "languages");

    let module = ["buffer".to_string(), "host".to_string()];
    let file = syn::parse_file(
        "use crate::{error::{Error, Result}, array::Array};\n\
         // use crate::compiler::CompileOptions;\n\
         use crate::{\n    host_object,\n};\n\
         use super::super::executor::Languages;\n\
         use super::local::Local;\n\
         fn f() -> crate::Client { crate::worker::Worker::start() }\n\
         #[cfg(test)]\nmod tests { use crate::session::RemoteSession; }\n\
         const AFTER: Option<crate::dispatch::Stream> = None;",
    )
    .unwrap();
    let found = top_level_imports(&module, &file, &reexports);
    let expected = [
        "array",
        "client",
        "dispatch",
        "error",
        "executor",
        "languages",
        "worker",
    ];
    assert_eq!(found, expected.iter().map(|s| s.to_string()).collect());

    let mod_rs = ["worker".to_string()];
    let file = syn::parse_file("use super::{\n    buffer::Buffer,\n};").unwrap();
    let found = top_level_imports(&mod_rs, &file, &reexports);
    assert_eq!(found, BTreeSet::from(["buffer".to_string()]));
}
