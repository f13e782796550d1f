"""Writes tests/cases/colocated.json as a C header for the C runner
(tests/c/test_shared_cases.c): the cases as static data, and one TEST per
case that runs it with `run_case`, or, for a case that needs what C lacks
(the table's `needs`, see `LACKS`), says why it skips it.

    python3 tests/cases/to_c.py tests/cases/colocated.json OUT.h
"""

import json
import sys


def c_string(text):
    return json.dumps(text)  # a JSON string of ASCII text is a C string literal


def numbers(kind, values):
    return f"(const {kind}[]){{{', '.join(repr(v) for v in values)}}}" if values else "NULL"


#: Memory kinds -> `colocated_memory_kind` values.
MEMORY_KINDS = {"device": 1, "pinned_host": 2, "unpinned_host": 3}


def array(a):
    """An argument or an output as a `case_array`."""
    return (
        f"{{{c_string(a['dtype'])}, {len(a['values'])}, {numbers('double', a['values'])}, "
        f"{len(a['devices'])}, {numbers('int', a['devices'])}, {int(a['split'])}, "
        f"{MEMORY_KINDS[a.get('memory_kind', 'device')]}}}"
    )


def call(c):
    args = f"(const case_array[]){{{', '.join(array(a) for a in c['args'])}}}" if c["args"] else "NULL"
    outs = c.get("outputs", [])
    outputs = f"(const case_array[]){{{', '.join(array(o) for o in outs)}}}" if outs else "NULL"
    error = c.get("error")
    code = c_string(error["code"]) if error else "NULL"
    fragment = c_string(error["fragment"]) if error else "NULL"
    cache = c.get("cache")
    counts = f"1, {cache['hits']}, {cache['misses']}" if cache else "0, 0, 0"
    return f"{{{len(c['args'])}, {args}, {len(outs)}, {outputs}, {code}, {fragment}, {counts}}}"


#: What C's calls lack (see the table's `needs`), and why.
LACKS = {"trees": "C calls have no trees: their inputs are flat"}


def main(source, target):
    with open(source) as f:
        table = json.load(f)
    lines = [
        f"/* Generated from {source} by tests/cases/to_c.py: do not edit. */",
        f"#define SHARED_CASES_DEVICES {table['devices']}",
        "static const shared_case SHARED_CASES[] = {",
    ]
    for case in table["cases"]:
        calls = ", ".join(call(c) for c in case["calls"])
        lines.append(
            f"  {{{c_string(case['name'])}, {c_string(case['function'])}, {len(case['calls'])}, "
            f"(const case_call[]){{{calls}}}, {case.get('freed', -1)}}},"
        )
    lines.append("};")
    for i, case in enumerate(table["cases"]):
        lacking = [LACKS[need] for need in case.get("needs", []) if need in LACKS]
        if lacking:
            reason = c_string(f"skipped ({case['name']}): {'; '.join(lacking)}\n")
            lines.append(f"TEST(shared_case_{i}) {{ fputs({reason}, stderr); }}")
        else:
            lines.append(f"TEST(shared_case_{i}) {{ run_case(&SHARED_CASES[{i}]); }}")
    with open(target, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
