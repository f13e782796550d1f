#!/usr/bin/env python3
"""Self-test of abi_manifest.py: no compiler needed.

Each test takes the checked-in manifest.json, writes a modified copy into a
temporary directory (as a later header and library would produce it), reads it
back and asserts that the comparison fails or passes as it should.

Run with ``python3 -m pytest tests/abi`` or ``python3 tests/abi/test_abi_manifest.py``.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True  # keep tests/abi free of __pycache__

import abi_manifest as am

MANIFEST = HERE / "manifest.json"
VERSIONED = "colocated_client_options"  # a struct_size-versioned struct
BY_VALUE = "colocated_string_view"  # passed by value and in arrays


def baseline() -> dict:
    """The checked-in manifest."""
    return am.load_manifest(MANIFEST)


def through_file(state: dict) -> dict:
    """Write ``state`` as a manifest into a temporary directory and read it back."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "manifest.json"
        path.write_text(am.dump(state) + "\n")
        return am.load_manifest(path)


def changed(edit) -> am.Report:
    """Compare the baseline with a copy of it modified by ``edit(copy)``."""
    old = baseline()
    new = copy.deepcopy(old)
    edit(new)
    return am.compare(old, through_file(new))


def bump_minor(state: dict) -> None:
    """What bumping COLOCATED_API_VERSION_MINOR does to a manifest."""
    c = state["constants"]
    c[am.MINOR] += 1
    c[am.VERSION] = (c[am.MAJOR] << 16) | c[am.MINOR]
    state["api_version"]["minor"] = c[am.MINOR]


def append_field(state: dict, struct: str, name: str = "new_field") -> None:
    """Append an 8-byte field at the end of ``struct``."""
    s = state["structs"][struct]
    s["fields"].append({"name": name, "offset": s["size"], "size": 8, "type": "uint64_t"})
    s["size"] += 8


def assert_fails(report: am.Report, *needles: str) -> None:
    """The report fails, and some problem mentions every needle."""
    assert report.failed, f"expected a failure, got {report}"
    text = "\n".join(report.problems + [report.version_not_bumped or ""])
    for needle in needles:
        assert needle in text, f"{needle!r} not in:\n{text}"


def assert_passes(report: am.Report) -> None:
    """The report passes."""
    assert not report.failed, "expected a pass, got:\n" + "\n".join(
        report.problems + [report.version_not_bumped or ""]
    )


# --- the manifest itself ----------------------------------------------------------


def test_manifest_is_complete_and_round_trips():
    """The checked-in manifest has every section and ``dump`` is stable."""
    m = baseline()
    for key in ("api_version", "constants", "enums", "structs", "typedefs", "symbols"):
        assert m[key], key
    assert m["api_version"]["major"] == m["constants"][am.MAJOR]
    assert "colocated_api_version" in m["symbols"]
    assert m["structs"][VERSIONED]["fields"][0]["name"] == "struct_size"
    assert am.dump(m) + "\n" == MANIFEST.read_text(), "manifest.json is not in dump() form"
    assert json.loads(am.dump(m)) == m


def test_identical_passes():
    """No change: passes with nothing to say."""
    report = changed(lambda m: None)
    assert_passes(report)
    assert not report.additions and not report.notes


# --- breaking changes fail ----------------------------------------------------------


def test_removed_symbol_fails():
    """A function the library exported is gone."""
    report = changed(lambda m: m["symbols"].pop("colocated_event_await"))
    assert_fails(report, "function colocated_event_await was removed")


def test_changed_signature_fails():
    """A parameter type changes."""
    def edit(m):
        s = m["symbols"]["colocated_event_await_timeout"]
        s["signature"] = s["signature"].replace("uint64_t", "uint32_t")
    assert_fails(changed(edit), "colocated_event_await_timeout changed signature")


def test_renamed_parameter_is_neutral():
    """Parameter names are not part of the ABI: a note, no failure."""
    def edit(m):
        s = m["symbols"]["colocated_event_await"]
        s["prototype"] = s["prototype"].replace("*event", "*ev")
    report = changed(edit)
    assert_passes(report)
    assert any("parameter names" in n for n in report.notes)


def test_moved_field_fails():
    """A field's offset changes."""
    def edit(m):
        m["structs"][VERSIONED]["fields"][1]["offset"] += 4
    assert_fails(changed(edit), f"struct {VERSIONED}: field num_cpu_devices moved from offset 8 to 12")


def test_resized_and_retyped_field_fails():
    """A field changes size and type."""
    def edit(m):
        f = m["structs"][VERSIONED]["fields"][2]
        f["size"], f["type"] = 8, "uint64_t"
        m["structs"][VERSIONED]["size"] = 24
    assert_fails(changed(edit), "executor_threads was resized from 4 to 8", "retyped")


def test_removed_field_fails():
    """The last field disappears and the struct shrinks."""
    original = baseline()["structs"][VERSIONED]
    last, size = original["fields"][-1], original["size"]
    smaller = last["offset"]

    def edit(m):
        s = m["structs"][VERSIONED]
        s["fields"].pop()
        s["size"] = smaller
    assert_fails(changed(edit), f"field {last['name']} was removed", f"got smaller: {size} -> {smaller}")


def test_inserted_field_fails():
    """A new field before existing ones moves them."""
    def edit(m):
        s = m["structs"][VERSIONED]
        s["fields"].insert(1, {"name": "early", "offset": 8, "size": 8, "type": "uint64_t"})
        for f in s["fields"][2:]:
            f["offset"] += 8
        s["size"] += 8
        bump_minor(m)
    assert_fails(changed(edit), "field early was inserted before existing fields")


def test_removed_struct_fails():
    """A struct is gone."""
    assert_fails(changed(lambda m: m["structs"].pop(VERSIONED)), f"struct {VERSIONED} was removed")


def test_growing_a_by_value_struct_fails():
    """Appending to a struct without struct_size breaks arrays and by-value uses."""
    def edit(m):
        append_field(m, BY_VALUE)
        bump_minor(m)
    assert_fails(changed(edit), f"struct {BY_VALUE} grew from 16 to 24 bytes", "struct_size")


def test_changed_enum_value_fails():
    """An enum member's value changes."""
    def edit(m):
        m["enums"]["colocated_dtype"]["members"]["COLOCATED_DTYPE_F32"] = 99
    assert_fails(changed(edit), "COLOCATED_DTYPE_F32 changed value from 12 to 99")


def test_removed_enum_member_fails():
    """An enum member disappears."""
    def edit(m):
        del m["enums"]["colocated_error_code"]["members"]["COLOCATED_UNAVAILABLE"]
    assert_fails(changed(edit), "member COLOCATED_UNAVAILABLE (= 14) was removed")


def test_changed_typedef_fails():
    """A callback type changes."""
    def edit(m):
        m["typedefs"]["colocated_destructor"] = "void (*)(void *, size_t)"
    assert_fails(changed(edit), "typedef colocated_destructor changed")


def test_major_version_change_fails():
    """The major version never changes."""
    def edit(m):
        m["constants"][am.MAJOR] += 1
        m["api_version"]["major"] += 1
    assert_fails(changed(edit), f"{am.MAJOR} changed")


def test_minor_version_decrease_fails():
    """The minor version only grows."""
    old = baseline()
    newer = copy.deepcopy(old)
    bump_minor(newer)
    assert_fails(am.compare(through_file(newer), old), f"constant {am.MINOR} changed")


def test_other_constant_change_fails():
    """Any other constant is fixed."""
    def edit(m):
        m["constants"]["COLOCATED_SOME_LIMIT"] = 1
    old = baseline()
    edit(old)
    new = copy.deepcopy(old)
    new["constants"]["COLOCATED_SOME_LIMIT"] = 2
    assert_fails(am.compare(old, through_file(new)), "constant COLOCATED_SOME_LIMIT changed from 1 to 2")


# --- additive changes pass, with a minor bump -----------------------------------


def test_appended_field_with_minor_bump_passes():
    """Appending to a struct_size-versioned struct is additive."""
    def edit(m):
        append_field(m, VERSIONED)
        bump_minor(m)
    report = changed(edit)
    assert_passes(report)
    assert any(f"struct {VERSIONED}: field(s) new_field appended" in a for a in report.additions)


def test_appended_field_without_minor_bump_fails():
    """Additions need COLOCATED_API_VERSION_MINOR bumped."""
    report = changed(lambda m: append_field(m, VERSIONED))
    assert not report.problems
    assert_fails(report, "COLOCATED_API_VERSION_MINOR was not bumped", "make abi-manifest")


def test_new_symbol_struct_enum_member_with_bump_pass():
    """New functions, structs, enum members and constants are additive."""
    def edit(m):
        m["symbols"]["colocated_new_thing"] = {
            "prototype": "colocated_error *colocated_new_thing(void)",
            "signature": "colocated_error *(void)",
        }
        m["structs"]["colocated_new_args"] = {
            "align": 8, "size": 8,
            "fields": [{"name": "struct_size", "offset": 0, "size": 8, "type": "size_t"}],
        }
        m["enums"]["colocated_dtype"]["members"]["COLOCATED_DTYPE_F8"] = 15
        m["constants"]["COLOCATED_NEW_LIMIT"] = 4
        bump_minor(m)
    report = changed(edit)
    assert_passes(report)
    text = "\n".join(report.additions)
    for needle in ("colocated_new_thing", "colocated_new_args", "COLOCATED_DTYPE_F8", "COLOCATED_NEW_LIMIT"):
        assert needle in text, needle


def test_new_symbol_without_bump_fails():
    """A new function without a minor bump fails with the hint."""
    def edit(m):
        m["symbols"]["colocated_new_thing"] = {
            "prototype": "void colocated_new_thing(void)", "signature": "void (void)",
        }
    assert_fails(changed(edit), "was not bumped")


# --- header versus library --------------------------------------------------------


def test_export_problems():
    """Every header function is exported and every colocated_ export is declared."""
    m = baseline()
    exports = sorted(m["symbols"])
    assert am.export_problems(m, exports) == []
    problems = am.export_problems(m, exports[1:] + ["colocated_secret"])
    assert any(f"declares {exports[0]}() but the library does not export it" in p for p in problems)
    assert any("exports colocated_secret but" in p for p in problems)


# --- the header parser (on preprocessed text; no compiler) ------------------------


SNIPPET = """
#define COLOCATED_H
#define COLOCATED_API_VERSION_MAJOR 1
#define COLOCATED_STRUCT_SIZE(type,last_field) (offsetof(type, last_field))
typedef struct colocated_client colocated_client;
enum colocated_kind
 {
  COLOCATED_KIND_A = 1,
  COLOCATED_KIND_B = 2,
};
typedef uint32_t colocated_kind;
typedef struct {
  size_t struct_size;
  const colocated_client *const *clients;
  uint8_t reserved[16];
  void (*hook)(void *user_data, size_t n);
} colocated_args;
typedef colocated_client *(*colocated_fn)(void *user_data, const char *name);
colocated_error *colocated_run(const colocated_args *args,
                               colocated_client **out);
void colocated_nothing(void);
"""


def test_parse_declarations():
    """Structs, enums, typedefs, functions and constants from cbindgen-style C."""
    d = am.parse_declarations(SNIPPET)
    assert d.constants == {"COLOCATED_API_VERSION_MAJOR": "1"}
    assert d.enums == {"colocated_kind": ("colocated_kind", "uint32_t", ["COLOCATED_KIND_A", "COLOCATED_KIND_B"])}
    ctype, kind, fields = d.structs["colocated_args"]
    assert (ctype, kind) == ("colocated_args", "struct")
    assert fields == [
        ("struct_size", "size_t"),
        ("clients", "const colocated_client *const *"),
        ("reserved", "uint8_t[16]"),
        ("hook", "void (*)(void *, size_t)"),
    ]
    assert d.typedefs == {
        "colocated_client": "struct colocated_client",
        "colocated_fn": "colocated_client *(*)(void *, const char *)",
    }
    assert d.functions["colocated_run"] == {
        "prototype": "colocated_error *colocated_run(const colocated_args *args, colocated_client **out)",
        "signature": "colocated_error *(const colocated_args *, colocated_client **)",
    }
    assert d.functions["colocated_nothing"]["signature"] == "void (void)"


def test_layout_program_mentions_every_field():
    """The generated C program measures every struct field, enum member and constant."""
    d = am.parse_declarations(SNIPPET)
    program = am.layout_program(Path("colocated.h"), d)
    assert '#include "colocated.h"' in program
    for needle in ("offsetof(colocated_args, hook)", "_Alignof(colocated_args)",
                   "(long long)(COLOCATED_KIND_B)", "(long long)(COLOCATED_API_VERSION_MAJOR)"):
        assert needle in program, needle


def main() -> int:
    """Run every ``test_*`` function without pytest."""
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    failed = 0
    for name, fn in tests:
        try:
            fn()
        except Exception:  # noqa: BLE001 - report every failure and go on
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
        else:
            print(f"ok   {name}")
    print(f"{len(tests) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
