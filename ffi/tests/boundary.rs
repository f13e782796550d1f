//! No panic crosses the C ABI: every export's body is one call of the panic
//! boundary (`guard`, or `boundary`/`boundary_void` built on it) or of a
//! getter helper that runs inside it (`get`, `get_str`, `get_list`). Read from
//! the source, so an export added without it fails here.

use std::path::Path;

/// Calls an export's body may be: the boundary and the helpers built on it.
const BOUNDARIES: &[&str] = &[
    "guard(",
    "boundary(",
    "boundary_void(",
    "get(",
    "get_str(",
    "get_list(",
];

/// `(file, export, body)` for every `extern "C" fn` defined in `source`.
fn exports(file: &str, source: &str) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    for (at, _) in source.match_indices("extern \"C\" fn ") {
        let rest = &source[at + "extern \"C\" fn ".len()..];
        let name_end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let name = &rest[..name_end];
        if name.is_empty() {
            continue; // a function pointer type: `extern "C" fn(...)`
        }
        // The parameters end at the parenthesis that closes the first one.
        let mut depth = 0usize;
        let mut params_end = None;
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        params_end = Some(i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(params_end) = params_end else {
            continue;
        };
        let Some(open) = rest[params_end..].find('{').map(|i| params_end + i) else {
            continue;
        };
        let mut depth = 0usize;
        let mut close = rest.len();
        for (i, c) in rest[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        found.push((
            file.to_string(),
            name.to_string(),
            rest[open + 1..close].to_string(),
        ));
    }
    found
}

/// Whether `body` is one boundary call, after any `const` items.
fn runs_inside_the_boundary(body: &str) -> bool {
    let code: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//") && !l.starts_with("const "))
        .collect();
    let Some(first) = code.first() else {
        return false;
    };
    let first = first.trim_start_matches("crate::");
    BOUNDARIES.iter().any(|b| first.starts_with(b))
}

#[test]
fn every_export_runs_inside_the_panic_boundary() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    for entry in std::fs::read_dir(&src).expect("src is readable") {
        let path = entry.expect("src is readable").path();
        if path.extension().is_some_and(|e| e == "rs") {
            let source = std::fs::read_to_string(&path).expect("source is UTF-8");
            let file = path.file_name().unwrap_or_default().to_string_lossy();
            all.extend(exports(&file, &source));
        }
    }
    assert!(all.len() > 100, "exports found: {}", all.len());
    let outside: Vec<String> = all
        .iter()
        .filter(|(_, _, body)| !runs_inside_the_boundary(body))
        .map(|(file, name, _)| format!("ffi/src/{file}: {name}"))
        .collect();
    assert!(
        outside.is_empty(),
        "exports whose body does not run inside the panic boundary:\n{}",
        outside.join("\n")
    );
}

#[test]
fn the_check_tells_a_guarded_body_from_a_bare_one() {
    let source = r#"
pub unsafe extern "C" fn colocated_a(x: *const u8) -> u32 {
    const N: u32 = 1;
    crate::guard(|| N)
}
pub extern "C" fn colocated_b(f: Option<unsafe extern "C" fn(u32) -> u32>) -> u32 {
    match f { Some(_) => 1, None => 0 }
}
"#;
    let found = exports("x.rs", source);
    let names: Vec<&str> = found.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(names, ["colocated_a", "colocated_b"]);
    assert!(runs_inside_the_boundary(&found[0].2));
    assert!(!runs_inside_the_boundary(&found[1].2));
}
