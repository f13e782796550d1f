"""The type stubs of the native module (``_colocated.pyi``) match the module: the
same public names, each class with the same public members, and every function
and method with the same parameters as the module's own signatures."""

import ast
import inspect
from pathlib import Path

from colocated import _colocated

STUB = Path(_colocated.__file__).with_name("_colocated.pyi")


def _stub():
    """Module-level names of the stub, and per class its members (name ->
    parameter names, or None for attributes and properties)."""
    tree = ast.parse(STUB.read_text())
    names, classes = {}, {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            names[node.name] = _params(node)
        elif isinstance(node, ast.ClassDef):
            members = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    decorators = {getattr(d, "id", getattr(d, "attr", None)) for d in item.decorator_list}
                    is_property = "property" in decorators or "setter" in decorators
                    members[item.name] = None if is_property else _params(item)
                elif isinstance(item, ast.AnnAssign):
                    members[item.target.id] = None
            names[node.name] = None
            classes[node.name] = members
        elif isinstance(node, ast.AnnAssign):
            names[node.target.id] = None
    return names, classes


def _params(fn: ast.FunctionDef) -> list[str]:
    args = fn.args
    names = [a.arg for a in args.posonlyargs + args.args]
    if args.vararg:
        names.append("*" + args.vararg.arg)
    names += [a.arg for a in args.kwonlyargs]
    if args.kwarg:
        names.append("**" + args.kwarg.arg)
    return [n for n in names if n not in ("self", "cls")]


def _runtime_params(obj) -> list[str] | None:
    """The parameter names of a native function or method (None when the
    module gives no signature)."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    names = []
    for p in signature.parameters.values():
        if p.name in ("self", "cls", "$self", "$cls"):
            continue
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        names.append(prefix + p.name)
    return names


def _public(name: str) -> bool:
    return not name.startswith("_") or name in ("__version__", "__init__", "__call__")


def test_the_stub_names_what_the_module_has():
    names, _ = _stub()
    module = {n for n in dir(_colocated) if _public(n) and not n.startswith("__") or n == "__version__"}
    assert set(names) == module, {"only in the stub": set(names) - module, "only in the module": module - set(names)}


def test_every_function_has_the_parameters_of_the_module():
    names, _ = _stub()
    for name, params in names.items():
        obj = getattr(_colocated, name)
        if params is None or not callable(obj) or isinstance(obj, type):
            continue
        assert _runtime_params(obj) == params, name


def test_every_class_has_the_members_and_parameters_of_the_module():
    _, classes = _stub()
    for name, members in classes.items():
        cls = getattr(_colocated, name)
        runtime = {m for m in vars(cls) if _public(m) and not m.startswith("__")}
        stubbed = {m for m in members if not m.startswith("__")}
        assert stubbed == runtime, (name, {"only in the stub": stubbed - runtime, "only in the module": runtime - stubbed})
        for member, params in members.items():
            # Slots such as __eq__ have the interpreter's generic signatures.
            if params is None or (member.startswith("__") and member not in ("__init__", "__call__")):
                continue
            if member == "__init__":
                got = _runtime_params(cls)
            else:
                got = _runtime_params(getattr(cls, member))
            if got is not None:
                assert got == params, f"{name}.{member}"


#: The native module's sources (in a source checkout; absent from a wheel).
NATIVE_SOURCES = Path(__file__).parents[1] / "src"


def test_the_native_module_imports_no_name_of_the_package():
    """The package hands the native module what it calls (``_register_hooks``,
    at import), so that the native code reads no private name of the package."""
    import re

    if not NATIVE_SOURCES.is_dir():
        return
    imports = re.compile(r"""import\(\s*(?:py\s*,\s*)?"colocated[."]""")
    found = [
        f"{path.relative_to(NATIVE_SOURCES)}:{number}: {line.strip()}"
        for path in sorted(NATIVE_SOURCES.rglob("*.rs"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if imports.search(line)
    ]
    assert found == []


def test_the_hooks_are_the_packages_own():
    """What the hooks do, through the native module: errors are the package's
    classes, devices pickle by id, and arrays come back as ``colocated.Array``."""
    import pickle

    import numpy as np

    import colocated

    device = colocated.devices()[0]
    assert pickle.loads(pickle.dumps(device)) == device
    x = colocated.device_put(np.arange(4, dtype=np.float32), device)
    assert type(colocated.colocated_python(lambda a: a)(x)) is colocated.Array
    try:
        colocated.colocated_python(lambda: None)()
    except colocated.InvalidArgumentError:
        pass
    else:
        raise AssertionError("a call without arguments or devices raised nothing")
