//! No panic crosses the C ABI: the body of every `extern "C"` function of the
//! library (its `#[no_mangle]` exports, in every file under `src`) is one call
//! of the panic boundary (`guard`, or `boundary`/`boundary_void` built on it)
//! or of a getter helper that runs inside it (`get`, `get_str`, `get_list`),
//! after any `const` items. Parsed with `syn`, so an export added without it,
//! or with code around the call, fails here.

use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Calls an export's body may be: the boundary and the helpers built on it.
const BOUNDARIES: &[&str] = &[
    "guard",
    "boundary",
    "boundary_void",
    "get",
    "get_str",
    "get_list",
];

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("src is readable").path();
        if path.is_dir() {
            found.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    found
}

/// The functions with a C ABI (`extern "C"` or plain `extern`) a file
/// defines, anywhere in it, and whether each is `#[no_mangle]`.
#[derive(Default)]
struct Exports<'ast> {
    found: Vec<(&'ast syn::ItemFn, bool)>,
    /// `#[no_mangle]` functions without a C ABI.
    not_c: Vec<String>,
}

impl<'ast> Visit<'ast> for Exports<'ast> {
    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        let no_mangle = item.attrs.iter().any(|a| match &a.meta {
            syn::Meta::Path(p) => p.is_ident("no_mangle"),
            // `#[unsafe(no_mangle)]`.
            syn::Meta::List(l) => l.path.is_ident("unsafe") && l.tokens.to_string() == "no_mangle",
            _ => false,
        });
        let c_abi = item
            .sig
            .abi
            .as_ref()
            .is_some_and(|abi| abi.name.as_ref().is_none_or(|n| n.value() == "C"));
        if c_abi {
            self.found.push((item, no_mangle));
        } else if no_mangle {
            self.not_c.push(item.sig.ident.to_string());
        }
        syn::visit::visit_item_fn(self, item);
    }
}

/// Whether `block` is one boundary call, after any `const` items.
fn runs_inside_the_boundary(block: &syn::Block) -> bool {
    let code: Vec<&syn::Stmt> = block
        .stmts
        .iter()
        .filter(|s| !matches!(s, syn::Stmt::Item(syn::Item::Const(_))))
        .collect();
    // With or without a `;` (a destroy function returns nothing).
    let [syn::Stmt::Expr(syn::Expr::Call(call), _)] = code.as_slice() else {
        return false;
    };
    let syn::Expr::Path(callee) = &*call.func else {
        return false;
    };
    callee
        .path
        .segments
        .last()
        .is_some_and(|last| BOUNDARIES.iter().any(|b| last.ident == b))
}

#[test]
fn every_export_runs_inside_the_panic_boundary() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut count = 0;
    let mut problems = Vec::new();
    for path in sources(&src) {
        let source = std::fs::read_to_string(&path).expect("source is UTF-8");
        let file = syn::parse_file(&source).expect("source parses");
        let shown = path.strip_prefix(&src).expect("under src").display();
        // An export a macro writes would hide its body from this test.
        if source.contains("macro_rules!") && source.contains("extern \"C\" fn $") {
            problems.push(format!("ffi/src/{shown}: a macro writes C functions"));
        }
        let mut exports = Exports::default();
        exports.visit_file(&file);
        for name in exports.not_c {
            problems.push(format!(
                "ffi/src/{shown}: {name} is #[no_mangle] without a C ABI"
            ));
        }
        for (item, no_mangle) in exports.found {
            count += usize::from(no_mangle);
            if !runs_inside_the_boundary(&item.block) {
                problems.push(format!("ffi/src/{shown}: {}", item.sig.ident));
            }
        }
    }
    assert!(count > 100, "exports found: {count}");
    assert!(
        problems.is_empty(),
        "exports whose body does not run inside the panic boundary:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_check_tells_a_guarded_body_from_any_other() {
    let file = syn::parse_file(
        r#"
#[no_mangle]
pub unsafe extern "C" fn colocated_a(x: *const u8) -> u32 {
    const N: u32 = 1;
    crate::guard(|| N)
}
#[no_mangle]
pub extern "C" fn colocated_b(f: Option<unsafe extern "C" fn(u32) -> u32>) -> u32 {
    match f { Some(_) => 1, None => 0 }
}
#[no_mangle]
pub extern fn colocated_c() -> u32 {
    guard(|| 1);
    2
}
mod inner {
    #[no_mangle]
    pub unsafe extern "C" fn colocated_d(out: *mut u32) -> *mut colocated_error {
        get(out, |x| *x)
    }
}
#[no_mangle]
pub fn colocated_e() {}
"#,
    )
    .unwrap();
    let mut exports = Exports::default();
    exports.visit_file(&file);
    let verdicts: Vec<(String, bool)> = exports
        .found
        .iter()
        .map(|(f, _)| (f.sig.ident.to_string(), runs_inside_the_boundary(&f.block)))
        .collect();
    assert_eq!(
        verdicts,
        [
            ("colocated_a".to_string(), true),
            ("colocated_b".to_string(), false),
            ("colocated_c".to_string(), false),
            ("colocated_d".to_string(), true),
        ]
    );
    assert_eq!(exports.not_c, ["colocated_e"]);
}
