"""Writes tests/cases/colocated.json as a C header for the C runner
(tests/c/test_shared_cases.c): the cases as static data, and one TEST per
case and run (the table's `runs`) that runs it with `run_case`, or, for a
case that needs what C lacks in that run (the table's `needs`, see `LACKS`),
says why it skips it.

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
    at_run = int(bool(error) and error.get("at", "call") == "run")
    cache = c.get("cache")
    counts = f"1, {cache['hits']}, {cache['misses']}" if cache else "0, 0, 0"
    return f"{{{len(c['args'])}, {args}, {len(outs)}, {outputs}, {code}, {fragment}, {at_run}, {counts}}}"


#: What C's calls lack (see the table's `needs`) in each run, and why.
TREES = "C calls have no trees: their inputs are flat"
LACKS = {
    "local": {"trees": TREES},
    "remote": {
        "trees": TREES,
        "remote_discovery": "C's functions on a worker are plugin functions, which cannot report their outputs "
        "nor their structure: C declares them once, from the first call's inputs, which fits only calls of one "
        "input spec and one structure",
        "remote_objects": "C's functions on a worker are plugin functions, which have no host objects",
        "remote_reentrant": "C's functions on a worker are plugin functions, which cannot call colocated functions",
    },
}


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
    for run in table["runs"]:
        for i, case in enumerate(table["cases"]):
            if run != "local" and "local_only" in case:
                continue
            lacking = [LACKS[run][need] for need in case.get("needs", []) if need in LACKS[run]]
            if lacking:
                reason = c_string(f"skipped ({run}: {case['name']}): {'; '.join(lacking)}\n")
                lines.append(f"TEST(shared_case_{i}_{run}) {{ fputs({reason}, stderr); }}")
            else:
                remote = "true" if run == "remote" else "false"
                lines.append(f"TEST(shared_case_{i}_{run}) {{ run_case(&SHARED_CASES[{i}], {remote}); }}")
    with open(target, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
