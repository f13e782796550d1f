//! What a StableHLO module (MLIR text) says about its entry function `@main`:
//! the element types, shapes and Shardy shardings of its arguments and
//! results, and the module's partition and replica counts.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// An argument or result of `@main`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tensor {
    pub dtype: DType,
    pub shape: Vec<i64>,
    /// Per dimension, the mesh axes it is split over (`sdy.sharding`);
    /// `None` when the module gives no sharding.
    pub sharding: Option<Vec<Vec<String>>>,
}

/// The entry function's signature and the module's SPMD attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Signature {
    pub num_partitions: usize,
    pub num_replicas: usize,
    /// The Shardy mesh `sdy.mesh`: axis names and sizes.
    pub mesh: Vec<(String, usize)>,
    pub inputs: Vec<Tensor>,
    pub outputs: Vec<Tensor>,
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::invalid_argument(format!("the StableHLO module's {what}"))
}

/// Reads the signature of `@main` from `module`, MLIR text.
///
/// Errors: `invalid_argument` for bytes that are not MLIR text with a
/// `@main` function, or types this runtime has no dtype for; `unimplemented`
/// for dynamic shapes and Shardy features it does not map (sub-axes,
/// explicit device ids).
/// What every MLIR bytecode file starts with.
const MLIR_BYTECODE_MAGIC: &[u8] = b"ML\xefR";

pub(crate) fn parse(module: &[u8]) -> Result<Signature> {
    if module.starts_with(MLIR_BYTECODE_MAGIC) {
        return Err(Error::unimplemented(
            "the module is MLIR bytecode (such as a jax.export artifact's \
             mlir_module_serialized); give it as MLIR text: jax's lowered.as_text() or \
             exported.mlir_module() (the Python SDK takes those objects themselves)",
        ));
    }
    let text = std::str::from_utf8(module).map_err(|_| {
        Error::unimplemented(
            "only StableHLO modules as MLIR text are taken (as jax's lowered.as_text() gives); \
             this one is not UTF-8 text (bytecode?)",
        )
    })?;
    let main = find_main(text)?;
    let (args, rest) = balanced(&text[main..], '(', ')')
        .ok_or_else(|| bad("@main has an unterminated argument list"))?;
    let inputs = split_top(args)
        .into_iter()
        .filter(|a| !a.trim().is_empty())
        .map(|a| tensor(a.split_once(':').map_or(a, |(_, t)| t)))
        .collect::<Result<Vec<_>>>()?;
    let rest = rest.trim_start();
    let outputs = match rest.strip_prefix("->") {
        None => Vec::new(),
        Some(results) => {
            let results = results.trim_start();
            if results.starts_with('(') {
                let (list, _) = balanced(results, '(', ')')
                    .ok_or_else(|| bad("@main has unterminated results"))?;
                split_top(list)
                    .into_iter()
                    .filter(|r| !r.trim().is_empty())
                    .map(tensor)
                    .collect::<Result<Vec<_>>>()?
            } else {
                vec![tensor(results)?]
            }
        }
    };
    Ok(Signature {
        num_partitions: module_count(text, "mhlo.num_partitions")?,
        num_replicas: module_count(text, "mhlo.num_replicas")?,
        mesh: mesh(text)?,
        inputs,
        outputs,
    })
}

/// Where `@main`'s argument list starts (at its `(`).
fn find_main(text: &str) -> Result<usize> {
    let mut from = 0;
    while let Some(at) = text[from..].find("@main") {
        let after = from + at + "@main".len();
        let rest = &text[after..];
        let trimmed = rest.trim_start();
        let before = text[..from + at].trim_end();
        // `func.func @main(`, `func.func public @main(`, `... private @main(`.
        let declares = ["func.func", "public", "private"]
            .iter()
            .any(|w| before.ends_with(w));
        if trimmed.starts_with('(') && declares {
            return Ok(after + (rest.len() - trimmed.len()));
        }
        from = after;
    }
    Err(bad(
        "entry function @main is missing (is it MLIR text of a StableHLO module?)",
    ))
}

/// The text inside the bracket pair that starts `s` (which must start with
/// `open`), and what follows the closing bracket. Brackets of every kind nest;
/// quoted strings are skipped.
fn balanced(s: &str, open: char, close: char) -> Option<(&str, &str)> {
    let mut chars = s.char_indices();
    match chars.next() {
        Some((_, c)) if c == open => {}
        _ => return None,
    }
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' | '>' => {
                // `->` is an arrow, not a closing bracket.
                if c == '>' && s[..i].ends_with('-') {
                    continue;
                }
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    if c != close {
                        return None;
                    }
                    return Some((&s[open.len_utf8()..i], &s[i + c.len_utf8()..]));
                }
            }
            _ => {}
        }
    }
    None
}

/// `s` split at commas outside brackets and strings.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start, mut in_string, mut escaped) = (0i32, 0, false, false);
    for (i, c) in s.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '(' | '[' | '{' | '<' => depth += 1,
            '>' if s[..i].ends_with('-') => {}
            ')' | ']' | '}' | '>' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// A `tensor<...>` type and its attributes (`{... sdy.sharding = ...}`).
fn tensor(s: &str) -> Result<Tensor> {
    let s = s.trim();
    let at = s
        .find("tensor<")
        .ok_or_else(|| bad(format!("type `{s}` is not a tensor")))?;
    let (inner, rest) =
        balanced(&s[at + "tensor".len()..], '<', '>').ok_or_else(|| bad(format!("type `{s}`")))?;
    let mut parts: Vec<&str> = inner.split('x').collect();
    // The element type is last; a layout or encoding after a comma is ignored.
    let element = parts
        .pop()
        .unwrap_or_default()
        .split(',')
        .next()
        .unwrap_or_default()
        .trim();
    let dtype = dtype(element)?;
    let shape = parts
        .iter()
        .map(|d| {
            let d = d.trim();
            if d == "?" {
                return Err(Error::unimplemented(format!(
                    "dynamic shapes are not supported (tensor<{inner}>)"
                )));
            }
            d.parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .ok_or_else(|| bad(format!("dimension `{d}` of tensor<{inner}>")))
        })
        .collect::<Result<Vec<_>>>()?;
    let sharding = match rest.find("sdy.sharding") {
        None => None,
        Some(at) => Some(dims_sharding(&rest[at..])?),
    };
    Ok(Tensor {
        dtype,
        shape,
        sharding,
    })
}

fn dtype(element: &str) -> Result<DType> {
    Ok(match element {
        "i1" => DType::Bool,
        "i8" | "si8" => DType::I8,
        "i16" | "si16" => DType::I16,
        "i32" | "si32" => DType::I32,
        "i64" | "si64" => DType::I64,
        "ui8" => DType::U8,
        "ui16" => DType::U16,
        "ui32" => DType::U32,
        "ui64" => DType::U64,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        "f64" => DType::F64,
        other => {
            return Err(Error::unimplemented(format!(
                "element type {other} is not supported (i1, i8-i64, ui8-ui64, f16, bf16, f32 and f64 are)"
            )))
        }
    })
}

/// `sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>`: the axes of each dimension.
fn dims_sharding(s: &str) -> Result<Vec<Vec<String>>> {
    let at = s
        .find("#sdy.sharding")
        .ok_or_else(|| bad("sdy.sharding attribute"))?;
    let (inner, _) = balanced(&s[at + "#sdy.sharding".len()..], '<', '>')
        .ok_or_else(|| bad("sdy.sharding attribute"))?;
    let open = inner
        .find('[')
        .ok_or_else(|| bad("sdy.sharding attribute"))?;
    let (dims, _) =
        balanced(&inner[open..], '[', ']').ok_or_else(|| bad("sdy.sharding attribute"))?;
    split_top(dims)
        .into_iter()
        .filter(|d| !d.trim().is_empty())
        .map(|d| {
            let d = d.trim();
            let (axes, _) = balanced(d, '{', '}')
                .ok_or_else(|| bad(format!("sdy.sharding dimension `{d}`")))?;
            if axes.contains(':') {
                return Err(Error::unimplemented(format!(
                    "Shardy sub-axes are not supported (`{d}`)"
                )));
            }
            Ok(split_top(axes)
                .into_iter()
                .map(str::trim)
                .filter(|a| a.starts_with('"'))
                .map(|a| a.trim_matches('"').to_string())
                .collect())
        })
        .collect()
}

/// `sdy.mesh @mesh = <["x"=4, "y"=2]>`: the axes and their sizes (none for
/// a module without a mesh).
fn mesh(text: &str) -> Result<Vec<(String, usize)>> {
    let Some(at) = text.find("sdy.mesh @") else {
        return Ok(Vec::new());
    };
    let rest = &text[at..];
    let open = rest.find('<').ok_or_else(|| bad("sdy.mesh"))?;
    let (inner, _) = balanced(&rest[open..], '<', '>').ok_or_else(|| bad("sdy.mesh"))?;
    if inner.contains("device_ids") {
        return Err(Error::unimplemented(
            "Shardy meshes with explicit device_ids are not supported",
        ));
    }
    let open = inner.find('[').ok_or_else(|| bad("sdy.mesh"))?;
    let (axes, _) = balanced(&inner[open..], '[', ']').ok_or_else(|| bad("sdy.mesh"))?;
    split_top(axes)
        .into_iter()
        .filter(|a| !a.trim().is_empty())
        .map(|a| {
            let (name, size) = a
                .split_once('=')
                .ok_or_else(|| bad(format!("sdy.mesh axis `{a}`")))?;
            let size = size
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad(format!("sdy.mesh axis `{a}`")))?;
            Ok((name.trim().trim_matches('"').to_string(), size))
        })
        .collect()
}

/// A module attribute `name = N : i32` (1 when absent).
fn module_count(text: &str, name: &str) -> Result<usize> {
    let Some(at) = text.find(name) else {
        return Ok(1);
    };
    let rest = text[at + name.len()..].trim_start();
    let rest = rest.strip_prefix('=').unwrap_or(rest).trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| bad(format!("attribute {name}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jax_lowered_sharded_module_reads() {
        let text = r#"module @jit_f attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=2, "y"=2]>
  func.func public @main(%arg0: tensor<8x4xf32> {mhlo.layout_mode = "default", sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, %arg1: tensor<i32>) -> (tensor<8x4xf32> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{"x", "y"}, {}]>}, tensor<2xi1>) {
    return %arg0, %b : tensor<8x4xf32>, tensor<2xi1>
  }
}"#;
        let s = parse(text.as_bytes()).unwrap();
        assert_eq!(s.num_partitions, 4);
        assert_eq!(s.num_replicas, 1);
        assert_eq!(s.mesh, vec![("x".to_string(), 2), ("y".to_string(), 2)]);
        assert_eq!(s.inputs.len(), 2);
        assert_eq!(s.inputs[0].dtype, DType::F32);
        assert_eq!(s.inputs[0].shape, vec![8, 4]);
        assert_eq!(
            s.inputs[0].sharding,
            Some(vec![vec!["x".to_string()], vec![]])
        );
        assert_eq!(s.inputs[1].shape, Vec::<i64>::new());
        assert_eq!(s.inputs[1].sharding, None);
        assert_eq!(
            s.outputs[0].sharding,
            Some(vec![vec!["x".to_string(), "y".to_string()], vec![]])
        );
        assert_eq!(s.outputs[1].dtype, DType::Bool);
    }

    #[test]
    fn a_single_result_without_parentheses_reads() {
        let text =
            "func.func @main(%a: tensor<3xbf16>) -> tensor<3xbf16> { return %a : tensor<3xbf16> }";
        let s = parse(text.as_bytes()).unwrap();
        assert_eq!(s.num_partitions, 1);
        assert_eq!(s.outputs.len(), 1);
        assert_eq!(s.outputs[0].dtype, DType::BF16);
    }

    #[test]
    fn what_is_not_supported_is_named() {
        let e = parse(b"module { func.func @other() { return } }").unwrap_err();
        assert_eq!(e.code(), crate::error::ErrorCode::InvalidArgument);
        assert!(e.message().contains("@main"), "{e}");
        let e = parse(b"func.func @main(%a: tensor<?xf32>) -> tensor<?xf32>").unwrap_err();
        assert_eq!(e.code(), crate::error::ErrorCode::Unimplemented);
        let e = parse(b"func.func @main(%a: tensor<2xcomplex<f32>>) -> tensor<2xf32>").unwrap_err();
        assert_eq!(e.code(), crate::error::ErrorCode::Unimplemented);
        let e = parse(&[0x4d, 0x4c, 0xef, 0x52, 0xff]).unwrap_err();
        assert_eq!(e.code(), crate::error::ErrorCode::Unimplemented);
        assert!(e.message().contains("MLIR bytecode"), "{e}");
        assert!(e.message().contains("as_text()"), "{e}");
        let e = parse(&[0xff, 0xfe, 0x00]).unwrap_err();
        assert_eq!(e.code(), crate::error::ErrorCode::Unimplemented);
        assert!(e.message().contains("not UTF-8"), "{e}");
    }
}
