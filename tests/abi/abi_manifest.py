#!/usr/bin/env python3
"""The ABI baseline of libcolocated: generate and check ``tests/abi/manifest.json``.

The manifest records what a program compiled against ``include/colocated.h`` and
linked against ``libcolocated.so`` depends on:

- ``symbols``: every function the header declares, with its prototype and its
  signature (the prototype without parameter names, which is what the ABI sees);
- ``structs``: every struct with a body, with ``sizeof``, ``_Alignof`` and, per
  field, ``offsetof``, size and type, all measured by the C compiler;
- ``enums``: every enum with its members' values and the size of its type;
- ``typedefs``: opaque handles and function-pointer (callback) types;
- ``constants``: the integer ``#define COLOCATED_*`` constants, including the
  API version.

Usage (see the top-level Makefile, ``make test-abi`` and ``make abi-manifest``)::

    abi_manifest.py generate --header H --lib L --manifest M --build DIR
    abi_manifest.py check    --header H --lib L --manifest M --build DIR

``check`` fails (exit 1) on any change an old binary could notice; additive
changes pass with a note, provided COLOCATED_API_VERSION_MINOR was bumped.
``generate`` refuses to record a breaking change unless ``--allow-breaking``.

How the header is read: its ``#include`` lines are dropped and the rest is run
through ``cc -E -P -dD -std=c11``, which removes comments and resolves the
``#if __cplusplus`` / C23 branches exactly as a C11 compiler sees them, while
keeping the ``#define`` lines. The resulting declarations are regular (cbindgen
output) and are parsed with a small tokenizer. Layouts and values are then
measured by compiling and running a generated C program against the real header.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

SYMBOL_PREFIX = "colocated_"
CONSTANT_PREFIX = "COLOCATED_"
MAJOR = "COLOCATED_API_VERSION_MAJOR"
MINOR = "COLOCATED_API_VERSION_MINOR"
VERSION = "COLOCATED_API_VERSION"
# Constants that may grow (never shrink) from one release to the next.
GROWABLE_CONSTANTS = frozenset({MINOR, VERSION})
MANIFEST_FORMAT = 1
REGENERATE_HINT = "run `make abi-manifest` and bump COLOCATED_API_VERSION_MINOR"

TOKEN_RE = re.compile(
    r"[A-Za-z_]\w*"  # identifiers and keywords
    r"|0[xX][0-9a-fA-F]+[uUlL]*|\d+[uUlL]*"  # integer literals
    r"|\.\.\.|<<|>>|\S"  # everything else, one character at a time
)
IDENT_RE = re.compile(r"^[A-Za-z_]\w*$")
# Words that belong to a type, never to a declarator's name.
TYPE_WORDS = frozenset((
    "void", "char", "short", "int", "long", "float", "double", "signed", "unsigned",
    "_Bool", "bool", "const", "volatile", "restrict", "struct", "union", "enum",
))
INTEGER_EXPR_RE = re.compile(r"^[\w\s()<>|&^~+\-*/%]+$")


class AbiError(Exception):
    """A problem with the inputs (header, library, compiler) rather than the ABI."""


# ---------------------------------------------------------------------------
# Reading the header
# ---------------------------------------------------------------------------


def tokenize(text: str) -> list[str]:
    """Split C source (without comments or directives) into tokens."""
    return TOKEN_RE.findall(text)


def format_tokens(tokens: list[str]) -> str:
    """Join tokens into canonical C text: ``const char *const *``, ``f(int, void *)``."""
    out: list[str] = []
    for tok in tokens:
        if out:
            prev = out[-1]
            if tok in (")", "]", ",", ";") or prev in ("(", "[", "*"):
                sep = ""
            elif tok in ("(", "["):
                sep = "" if (IDENT_RE.match(prev) or prev in (")", "]")) else " "
            else:
                sep = " "
            out.append(sep)
        out.append(tok)
    return "".join(out)


def _matching(tokens: list[str], start: int) -> int:
    """Index of the bracket closing the one at ``tokens[start]``."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    opening = tokens[start]
    closing = pairs[opening]
    depth = 0
    for i in range(start, len(tokens)):
        if tokens[i] == opening:
            depth += 1
        elif tokens[i] == closing:
            depth -= 1
            if depth == 0:
                return i
    raise AbiError(f"unbalanced {opening!r} in: {format_tokens(tokens)}")


def split_top_level(tokens: list[str], separator: str) -> list[list[str]]:
    """Split ``tokens`` at ``separator`` where no bracket is open; drops empty parts."""
    parts: list[list[str]] = [[]]
    depth = 0
    for tok in tokens:
        if tok in ("(", "[", "{"):
            depth += 1
        elif tok in (")", "]", "}"):
            depth -= 1
        if tok == separator and depth == 0:
            parts.append([])
        else:
            parts[-1].append(tok)
    return [p for p in parts if p]


def split_declarator(tokens: list[str]) -> tuple[str | None, str]:
    """Split one declaration into (name or None, type text without the name).

    Handles plain declarators (``const char *data``), arrays (``uint8_t pad[8]``)
    and function pointers (``void (*cb)(void *)``). Bit-fields are rejected.
    """
    if ":" in tokens:
        raise AbiError(f"bit-fields are not supported: {format_tokens(tokens)}")
    for i in range(len(tokens) - 4):
        if tokens[i] == "(" and tokens[i + 1] == "*" and IDENT_RE.match(tokens[i + 2]) \
                and tokens[i + 3] == ")" and tokens[i + 4] == "(":
            close = _matching(tokens, i + 4)
            _, types = _parse_params(tokens[i + 5: close])
            return tokens[i + 2], _function_type(format_tokens(tokens[:i]), types, "(*)")
    end = len(tokens)
    while end > 0 and tokens[end - 1] == "]":
        depth = 0
        for j in range(end - 1, -1, -1):
            if tokens[j] == "]":
                depth += 1
            elif tokens[j] == "[":
                depth -= 1
                if depth == 0:
                    end = j
                    break
        else:
            raise AbiError(f"unbalanced '[' in: {format_tokens(tokens)}")
    suffix = tokens[end:]
    head = tokens[:end]
    if len(head) > 1 and IDENT_RE.match(head[-1]) and head[-1] not in TYPE_WORDS:
        return head[-1], format_tokens(head[:-1] + suffix)
    return None, format_tokens(tokens)


def _function_type(returns: str, params: list[str], pointer: str = "") -> str:
    """``colocated_error *(const x *, size_t)``, ``void (*)(void *)`` (``pointer="(*)"``)."""
    sep = "" if returns.endswith("*") else " "
    return f"{returns}{sep}{pointer}({', '.join(params)})"


def _parse_params(tokens: list[str]) -> tuple[list[str], list[str]]:
    """Parameter list tokens → (full parameter texts, parameter types)."""
    full: list[str] = []
    types: list[str] = []
    for param in split_top_level(tokens, ","):
        full.append(format_tokens(param))
        types.append(split_declarator(param)[1])
    return full, types


@dataclass
class Declarations:
    """Everything the header declares, before layouts are measured."""

    functions: dict[str, dict[str, str]] = field(default_factory=dict)
    # struct name -> (C type expression, kind, [(field name, field type)])
    structs: dict[str, tuple[str, str, list[tuple[str, str]]]] = field(default_factory=dict)
    # enum name -> (C type expression, underlying type or None, [member names])
    enums: dict[str, tuple[str, str | None, list[str]]] = field(default_factory=dict)
    typedefs: dict[str, str] = field(default_factory=dict)
    # constant name -> replacement text
    constants: dict[str, str] = field(default_factory=dict)


def _parse_aggregate_body(tokens: list[str], where: str) -> list[tuple[str, str]]:
    """The fields of a struct/union body (the tokens between the braces)."""
    fields: list[tuple[str, str]] = []
    for decl in split_top_level(tokens, ";"):
        if "{" in decl:
            raise AbiError(f"nested struct/union bodies are not supported in {where}")
        if len(split_top_level(decl, ",")) > 1 and "(" not in decl:
            raise AbiError(f"one field per declaration please, in {where}: {format_tokens(decl)}")
        name, ftype = split_declarator(decl)
        if name is None:
            raise AbiError(f"unnamed field in {where}: {format_tokens(decl)}")
        fields.append((name, ftype))
    return fields


def _parse_enum(tokens: list[str], decls: Declarations, typedef_name: str | None) -> None:
    """``enum [tag] [: type] { ... } [name]`` (``tokens`` start at ``enum``)."""
    brace = tokens.index("{")
    close = _matching(tokens, brace)
    tag = tokens[1] if brace > 1 and IDENT_RE.match(tokens[1]) else None
    name = typedef_name or tag
    if name is None:
        raise AbiError(f"anonymous enum without a typedef: {format_tokens(tokens)}")
    members = [m[0] for m in split_top_level(tokens[brace + 1: close], ",")]
    ctype = typedef_name if typedef_name else f"enum {tag}"
    decls.enums[name] = (ctype, None, members)


def parse_declarations(code: str) -> Declarations:
    """Parse preprocessed header text (declarations plus ``#define`` lines)."""
    decls = Declarations()
    body_lines = []
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            m = re.match(r"#\s*define\s+([A-Za-z_]\w*)(\(?)\s*(.*)$", stripped)
            if m and m.group(1).startswith(CONSTANT_PREFIX) and not m.group(2) and m.group(3):
                decls.constants[m.group(1)] = " ".join(m.group(3).split())
            continue
        body_lines.append(line)
    tokens = tokenize("\n".join(body_lines))
    plain_typedefs: dict[str, str] = {}
    for stmt in split_top_level(tokens, ";"):
        if stmt[0] == "typedef":
            rest = stmt[1:]
            if rest[0] in ("struct", "union") and "{" in rest:
                brace = rest.index("{")
                close = _matching(rest, brace)
                name = rest[close + 1] if close + 1 < len(rest) else None
                if name is None or close + 2 != len(rest):
                    raise AbiError(f"unsupported typedef: {format_tokens(stmt)}")
                fields = _parse_aggregate_body(rest[brace + 1: close], name)
                decls.structs[name] = (name, rest[0], fields)
            elif rest[0] == "enum" and "{" in rest:
                _parse_enum(rest[:-1], decls, rest[-1])
            elif rest[0] in ("struct", "union", "enum") and len(rest) == 3:
                decls.typedefs[rest[2]] = f"{rest[0]} {rest[1]}"
            else:
                name, ttype = split_declarator(rest)
                if name is None:
                    raise AbiError(f"unsupported typedef: {format_tokens(stmt)}")
                plain_typedefs[name] = ttype
        elif stmt[0] in ("struct", "union") and "{" in stmt:
            tag = stmt[1]
            brace = stmt.index("{")
            close = _matching(stmt, brace)
            name = f"{stmt[0]} {tag}"
            decls.structs[name] = (name, stmt[0], _parse_aggregate_body(stmt[brace + 1: close], name))
        elif stmt[0] == "enum" and "{" in stmt:
            _parse_enum(stmt, decls, None)
        elif "(" in stmt:
            _parse_function(stmt, decls)
        else:
            raise AbiError(f"unsupported declaration in the header: {format_tokens(stmt)}")
    # `enum colocated_dtype { ... }; typedef uint32_t colocated_dtype;` (cbindgen's C11
    # branch) is one enum whose type is the typedef.
    for name, ttype in plain_typedefs.items():
        if name in decls.enums and decls.enums[name][0] == f"enum {name}":
            _, _, members = decls.enums[name]
            decls.enums[name] = (name, ttype, members)
        else:
            decls.typedefs[name] = ttype
    return decls


def _parse_function(stmt: list[str], decls: Declarations) -> None:
    """A function prototype: ``ret name(params) [attributes]``."""
    tokens = [t for t in stmt if t != "extern"]
    for i, tok in enumerate(tokens):
        if tok == "(" and i > 0 and IDENT_RE.match(tokens[i - 1]):
            break
    else:
        raise AbiError(f"unsupported declaration in the header: {format_tokens(stmt)}")
    name = tokens[i - 1]
    close = _matching(tokens, i)
    returns = format_tokens(tokens[: i - 1])
    full, types = _parse_params(tokens[i + 1: close])
    sep = "" if returns.endswith("*") else " "
    decls.functions[name] = {
        "prototype": f"{returns}{sep}{name}({', '.join(full)})",
        "signature": _function_type(returns, types),
    }


def preprocess_header(header: Path, build: Path, cc: str) -> str:
    """The header as a C11 compiler sees it, without comments, with its #defines."""
    build.mkdir(parents=True, exist_ok=True)
    text = header.read_text()
    stripped = "\n".join(
        "" if re.match(r"\s*#\s*include\b", line) else line for line in text.splitlines()
    )
    copy_path = build / f"{header.stem}.noinclude.h"
    copy_path.write_text(stripped + "\n")
    result = subprocess.run(
        [cc, "-E", "-P", "-dD", "-std=c11", "-x", "c", str(copy_path)],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise AbiError(f"preprocessing {header} failed:\n{result.stderr}")
    return result.stdout


# ---------------------------------------------------------------------------
# Measuring layouts and values
# ---------------------------------------------------------------------------


def _c_string(text: str) -> str:
    return json.dumps(text)  # a JSON string of ASCII text is a valid C string literal


def layout_program(header: Path, decls: Declarations) -> str:
    """A C program printing sizes, alignments, offsets and values, one per line."""
    lines = [
        "/* Generated by tests/abi/abi_manifest.py: prints the ABI facts of the header. */",
        "#include <stddef.h>",
        "#include <stdio.h>",
        f"#include {_c_string(header.name)}",
        "",
        "int main(void) {",
    ]
    for name, (ctype, _, fields) in decls.structs.items():
        lines.append(
            f'  printf("S\\t%s\\t%zu\\t%zu\\n", {_c_string(name)}, sizeof({ctype}), _Alignof({ctype}));'
        )
        for fname, _ in fields:
            lines.append(
                f'  printf("F\\t%s\\t%s\\t%zu\\t%zu\\n", {_c_string(name)}, {_c_string(fname)}, '
                f"offsetof({ctype}, {fname}), sizeof((({ctype} *)0)->{fname}));"
            )
    for name, (ctype, _, members) in decls.enums.items():
        lines.append(f'  printf("E\\t%s\\t%zu\\n", {_c_string(name)}, sizeof({ctype}));')
        for member in members:
            lines.append(
                f'  printf("M\\t%s\\t%s\\t%lld\\n", {_c_string(name)}, {_c_string(member)}, '
                f"(long long)({member}));"
            )
    for name, value in decls.constants.items():
        if INTEGER_EXPR_RE.match(value) and '"' not in value:
            lines.append(f'  printf("C\\t%s\\t%lld\\n", {_c_string(name)}, (long long)({name}));')
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)


def measure(header: Path, decls: Declarations, build: Path, cc: str) -> list[list[str]]:
    """Compile and run the layout program; its output lines split at tabs."""
    source = build / "abi_layout.c"
    binary = build / "abi_layout"
    source.write_text(layout_program(header, decls))
    compile_cmd = [
        cc, "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{header.parent.resolve()}",
        str(source), "-o", str(binary),
    ]
    result = subprocess.run(compile_cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AbiError(f"compiling {source} failed ({' '.join(compile_cmd)}):\n{result.stderr}")
    result = subprocess.run([str(binary)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AbiError(f"running {binary} failed:\n{result.stderr}")
    return [line.split("\t") for line in result.stdout.splitlines() if line]


def exported_symbols(lib: Path) -> list[str]:
    """Defined dynamic symbols of ``lib`` whose names start with ``colocated_``."""
    result = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise AbiError(f"nm -D --defined-only {lib} failed:\n{result.stderr}")
    names = set()
    for line in result.stdout.splitlines():
        parts = line.split()
        if parts:
            name = parts[-1].split("@")[0]
            if name.startswith(SYMBOL_PREFIX):
                names.add(name)
    return sorted(names)


def build_state(decls: Declarations, facts: list[list[str]]) -> dict:
    """The manifest dict from the parsed declarations and the measured facts."""
    structs: dict[str, dict] = {}
    enums: dict[str, dict] = {}
    constants: dict[str, int | str] = {}
    field_types = {name: dict(fields) for name, (_, _, fields) in decls.structs.items()}
    for fact in facts:
        kind = fact[0]
        if kind == "S":
            kind_name = decls.structs[fact[1]][1]
            structs[fact[1]] = {"align": int(fact[3]), "size": int(fact[2]), "fields": []}
            if kind_name != "struct":
                structs[fact[1]]["kind"] = kind_name
        elif kind == "F":
            structs[fact[1]]["fields"].append({
                "name": fact[2], "offset": int(fact[3]), "size": int(fact[4]),
                "type": field_types[fact[1]][fact[2]],
            })
        elif kind == "E":
            underlying = decls.enums[fact[1]][1]
            enums[fact[1]] = {"type": underlying or decls.enums[fact[1]][0],
                              "size": int(fact[2]), "members": {}}
        elif kind == "M":
            enums[fact[1]]["members"][fact[2]] = int(fact[3])
        elif kind == "C":
            constants[fact[1]] = int(fact[2])
    for name, value in decls.constants.items():
        constants.setdefault(name, value)  # non-integer constants compare as text
    for enum in enums.values():
        enum["members"] = dict(sorted(enum["members"].items(), key=lambda kv: (kv[1], kv[0])))
    state: dict = {
        "format": MANIFEST_FORMAT,
        "comment": "The ABI baseline of libcolocated. Generated by `make abi-manifest` "
                   "(tests/abi/abi_manifest.py); checked by `make test-abi`. Do not edit.",
    }
    if isinstance(constants.get(MAJOR), int) and isinstance(constants.get(MINOR), int):
        state["api_version"] = {"major": constants[MAJOR], "minor": constants[MINOR]}
    state["constants"] = dict(sorted(constants.items()))
    state["enums"] = dict(sorted(enums.items()))
    state["structs"] = dict(sorted(structs.items()))
    state["typedefs"] = dict(sorted(decls.typedefs.items()))
    state["symbols"] = dict(sorted(decls.functions.items()))
    return state


def collect(header: Path, lib: Path, build: Path, cc: str) -> tuple[dict, list[str]]:
    """Read the header, measure it, list the library's exports: (state, exports)."""
    build.mkdir(parents=True, exist_ok=True)
    decls = parse_declarations(preprocess_header(header, build, cc))
    state = build_state(decls, measure(header, decls, build, cc))
    return state, exported_symbols(lib)


# ---------------------------------------------------------------------------
# Comparing
# ---------------------------------------------------------------------------


@dataclass
class Report:
    """The outcome of comparing the recorded ABI with the current one."""

    problems: list[str] = field(default_factory=list)  # breaking: fail
    additions: list[str] = field(default_factory=list)  # additive: need a minor bump
    notes: list[str] = field(default_factory=list)  # ABI-neutral: informational
    version_not_bumped: str | None = None  # set when additions lack a minor bump

    @property
    def failed(self) -> bool:
        """Whether ``check`` must fail."""
        return bool(self.problems) or self.version_not_bumped is not None


def export_problems(state: dict, exports: list[str]) -> list[str]:
    """Header functions the library lacks, and exports the header does not declare."""
    declared = set(state.get("symbols", {}))
    exported = set(exports)
    problems = [
        f"header declares {name}() but the library does not export it"
        for name in sorted(declared - exported)
    ]
    problems += [
        f"library exports {name} but include/colocated.h does not declare it "
        "(regenerate the header with `make header`, or do not export it)"
        for name in sorted(exported - declared)
    ]
    return problems


def _version(state: dict) -> tuple[int, int] | None:
    v = state.get("api_version")
    return (v["major"], v["minor"]) if v else None


def _compare_symbols(old: dict, new: dict, report: Report) -> None:
    for kind, key in (("function", "symbols"), ("typedef", "typedefs")):
        old_items, new_items = old.get(key, {}), new.get(key, {})
        for name, was in old_items.items():
            now = new_items.get(name)
            if now is None:
                report.problems.append(f"{kind} {name} was removed (was: {_describe(was)})")
            elif isinstance(was, dict) and was["signature"] != now["signature"]:
                report.problems.append(
                    f"function {name} changed signature: {was['signature']} -> {now['signature']}"
                )
            elif isinstance(was, dict) and was["prototype"] != now["prototype"]:
                report.notes.append(
                    f"function {name}: parameter names changed (ABI-neutral): "
                    f"{now['prototype']} — run `make abi-manifest` to refresh"
                )
            elif not isinstance(was, dict) and was != now:
                report.problems.append(f"typedef {name} changed: {was} -> {now}")
        for name in sorted(set(new_items) - set(old_items)):
            report.additions.append(f"new {kind} {name}: {_describe(new_items[name])}")


def _describe(item: dict | str) -> str:
    return item["prototype"] if isinstance(item, dict) else item


def _compare_structs(old: dict, new: dict, report: Report) -> None:
    old_structs, new_structs = old.get("structs", {}), new.get("structs", {})
    for name, was in old_structs.items():
        now = new_structs.get(name)
        if now is None:
            report.problems.append(f"struct {name} was removed")
            continue
        problems_before = len(report.problems)
        new_fields = {f["name"]: (i, f) for i, f in enumerate(now["fields"])}
        old_names = {f["name"] for f in was["fields"]}
        for f in was["fields"]:
            where = f"struct {name}: field {f['name']}"
            if f["name"] not in new_fields:
                report.problems.append(f"{where} was removed (was at offset {f['offset']})")
                continue
            g = new_fields[f["name"]][1]
            if g["offset"] != f["offset"]:
                report.problems.append(f"{where} moved from offset {f['offset']} to {g['offset']}")
            if g["size"] != f["size"]:
                report.problems.append(f"{where} was resized from {f['size']} to {g['size']} bytes")
            if g["type"] != f["type"]:
                report.problems.append(f"{where} was retyped from `{f['type']}` to `{g['type']}`")
        last_old_index = max(
            (new_fields[n][0] for n in old_names if n in new_fields), default=-1
        )
        appended = []
        for i, g in enumerate(now["fields"]):
            if g["name"] in old_names:
                continue
            if i < last_old_index:
                report.problems.append(
                    f"struct {name}: field {g['name']} was inserted before existing fields "
                    "(new fields go at the end)"
                )
            else:
                appended.append(g["name"])
        if now["align"] != was["align"]:
            report.problems.append(f"struct {name}: alignment changed from {was['align']} to {now['align']}")
        if now["size"] < was["size"]:
            report.problems.append(f"struct {name} got smaller: {was['size']} -> {now['size']} bytes")
        elif now["size"] > was["size"] or appended:
            versioned = bool(was["fields"]) and was["fields"][0]["name"] == "struct_size"
            if not versioned:
                report.problems.append(
                    f"struct {name} grew from {was['size']} to {now['size']} bytes but it has no "
                    "leading `size_t struct_size`: it is passed by value or in arrays, so old "
                    "binaries would use the old size and stride (add a new struct instead)"
                )
            elif len(report.problems) == problems_before:
                report.additions.append(
                    f"struct {name}: field(s) {', '.join(appended) or '(padding)'} appended, "
                    f"size {was['size']} -> {now['size']} bytes"
                )
    for name in sorted(set(new_structs) - set(old_structs)):
        report.additions.append(f"new struct {name} ({new_structs[name]['size']} bytes)")


def _compare_enums(old: dict, new: dict, report: Report) -> None:
    old_enums, new_enums = old.get("enums", {}), new.get("enums", {})
    for name, was in old_enums.items():
        now = new_enums.get(name)
        if now is None:
            report.problems.append(f"enum {name} was removed")
            continue
        if now["size"] != was["size"] or now.get("type") != was.get("type"):
            report.problems.append(
                f"enum {name}: type changed from {was.get('type', '?')} ({was['size']} bytes) "
                f"to {now.get('type', '?')} ({now['size']} bytes)"
            )
        for member, value in was["members"].items():
            if member not in now["members"]:
                report.problems.append(f"enum {name}: member {member} (= {value}) was removed")
            elif now["members"][member] != value:
                report.problems.append(
                    f"enum {name}: member {member} changed value from {value} to {now['members'][member]}"
                )
        for member in sorted(set(now["members"]) - set(was["members"])):
            report.additions.append(f"enum {name}: new member {member} = {now['members'][member]}")
    for name in sorted(set(new_enums) - set(old_enums)):
        report.additions.append(f"new enum {name}")


def _compare_constants(old: dict, new: dict, report: Report) -> None:
    old_c, new_c = old.get("constants", {}), new.get("constants", {})
    for name, value in old_c.items():
        if name not in new_c:
            report.problems.append(f"constant {name} (= {value}) was removed")
            continue
        now = new_c[name]
        if now == value:
            continue
        if name == MAJOR:
            report.problems.append(
                f"{MAJOR} changed from {value} to {now}: the major version is never changed "
                "(a breaking change is not allowed; add new functions and structs instead)"
            )
        elif name in GROWABLE_CONSTANTS and isinstance(now, int) and isinstance(value, int) \
                and now > value:
            continue
        else:
            report.problems.append(f"constant {name} changed from {value} to {now}")
    for name in sorted(set(new_c) - set(old_c)):
        report.additions.append(f"new constant {name} = {new_c[name]}")


def compare(old: dict, new: dict) -> Report:
    """Compare a recorded manifest ``old`` with the current state ``new``."""
    report = Report()
    _compare_symbols(old, new, report)
    _compare_structs(old, new, report)
    _compare_enums(old, new, report)
    _compare_constants(old, new, report)
    old_v, new_v = _version(old), _version(new)
    if report.additions and old_v and new_v and new_v[0] == old_v[0] and new_v[1] <= old_v[1]:
        report.version_not_bumped = (
            f"additive changes but COLOCATED_API_VERSION_MINOR was not bumped (manifest "
            f"{old_v[0]}.{old_v[1]}, header {new_v[0]}.{new_v[1]}) — {REGENERATE_HINT}"
        )
    elif not report.additions and old_v and new_v and new_v != old_v:
        report.notes.append(
            f"API version is {new_v[0]}.{new_v[1]} but the manifest records {old_v[0]}.{old_v[1]}"
            " — run `make abi-manifest`"
        )
    return report


# ---------------------------------------------------------------------------
# The manifest file
# ---------------------------------------------------------------------------


def dump(obj: object, indent: int = 0, width: int = 100, in_list: bool = False) -> str:
    """Format ``obj`` as stable, diff-friendly JSON.

    Keys keep the (sorted) order ``build_state`` gives them; each struct field, and
    any other short flat object, goes on one line.
    """
    if isinstance(obj, (dict, list)) and obj:
        values = obj.values() if isinstance(obj, dict) else obj
        if all(not isinstance(v, (dict, list)) for v in values):
            one_line = json.dumps(obj, separators=(", ", ": "))
            if indent + len(one_line) <= width or (in_list and isinstance(obj, dict)):
                return one_line
        pad = " " * (indent + 2)
        if isinstance(obj, dict):
            items = [f"{pad}{json.dumps(k)}: {dump(v, indent + 2, width)}" for k, v in obj.items()]
            return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
        items = [f"{pad}{dump(v, indent + 2, width, in_list=True)}" for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    return json.dumps(obj)


def load_manifest(path: Path) -> dict:
    """Read a manifest written by ``generate``."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as e:
        raise AbiError(f"{path} does not exist: run `make abi-manifest` first") from e
    except json.JSONDecodeError as e:
        raise AbiError(f"{path} is not valid JSON: {e}") from e


def _summary_counts(state: dict) -> str:
    return (
        f"{len(state['symbols'])} functions, {len(state['structs'])} structs, "
        f"{len(state['enums'])} enums, {len(state['typedefs'])} typedefs, "
        f"{len(state['constants'])} constants"
    )


def _version_text(state: dict) -> str:
    v = _version(state)
    return f"{v[0]}.{v[1]}" if v else "?"


def _print_report(report: Report, out=sys.stdout) -> None:
    for problem in report.problems:
        print(f"FAIL: {problem}", file=out)
    if report.version_not_bumped:
        print(f"FAIL: {report.version_not_bumped}", file=out)
    for addition in report.additions:
        print(f"note: additive change: {addition} — {REGENERATE_HINT}", file=out)
    for note in report.notes:
        print(f"note: {note}", file=out)


def cmd_check(args: argparse.Namespace) -> int:
    """``check``: compare the header and library with the manifest."""
    old = load_manifest(args.manifest)
    new, exports = collect(args.header, args.lib, args.build, args.cc)
    report = compare(old, new)
    report.problems += export_problems(new, exports)
    _print_report(report)
    if report.failed:
        count = len(report.problems) + (1 if report.version_not_bumped else 0)
        print(f"ABI check FAILED: {count} problem(s), {len(report.additions)} additive "
              f"change(s) against {args.manifest} (API {_version_text(old)} -> {_version_text(new)})")
        return 1
    extra = f", {len(report.additions)} additive change(s)" if report.additions else ""
    print(f"ABI check passed: {_summary_counts(new)} compatible with {args.manifest} "
          f"(API {_version_text(new)}{extra})")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """``generate``: write the manifest (refusing to record breaking changes)."""
    new, exports = collect(args.header, args.lib, args.build, args.cc)
    problems = export_problems(new, exports)
    if args.manifest.exists():
        report = compare(load_manifest(args.manifest), new)
        _print_report(report)
        if report.problems and not args.allow_breaking:
            print("refusing to record breaking changes in the ABI baseline (each FAIL above); "
                  "fix them, or pass --allow-breaking if this really is a new major version")
            return 1
        if report.version_not_bumped:
            print("warning: recording additions without a COLOCATED_API_VERSION_MINOR bump")
    for problem in problems:
        print(f"FAIL: {problem}")
    if problems:
        print("not writing the manifest: the header and the library disagree")
        return 1
    args.manifest.parent.mkdir(parents=True, exist_ok=True)
    args.manifest.write_text(dump(new) + "\n")
    print(f"wrote {args.manifest}: {_summary_counts(new)} (API {_version_text(new)})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("generate", "check"))
    parser.add_argument("--header", type=Path, required=True, help="include/colocated.h")
    parser.add_argument("--lib", type=Path, required=True, help="libcolocated.so")
    parser.add_argument("--manifest", type=Path, required=True, help="tests/abi/manifest.json")
    parser.add_argument("--build", type=Path, required=True, help="scratch directory")
    parser.add_argument("--cc", default=os.environ.get("CC", "cc"), help="C compiler (default $CC or cc)")
    parser.add_argument("--allow-breaking", action="store_true",
                        help="generate: record breaking changes too (a new major version)")
    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            return cmd_generate(args)
        return cmd_check(args)
    except AbiError as e:
        print(f"abi_manifest.py: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"abi_manifest.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
