"""The layout's rules, read from the code: dependencies point one way, and modules stay small.

- parsers import nothing of the daemon or the exporters (the grammar is pure), and what any
  grammar is made of (the modules directly under parsers/) imports no grammar folder;
- the daemon's stages (sources, state, supervise, sim) import no exporter: only the composition
  root (the daemon's top-level modules: app, cli, loop, its tasks and event feed, config; and
  the offline tools) wires exporters in;
- exporters import from the daemon only the value types they format (the snapshot, the published
  bundle, the sources' input records, the state's duration formatter and KV-dtype codes), never
  its runtime;
- so the module import graph between daemon and exporters has no cycle.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"daemon": "loadwatch.daemon", "parsers": "loadwatch.parsers", "exporters": "loadwatch.exporters"}  # fmt: skip
VALUE_MODULES = {
    "loadwatch.daemon.state.snapshot",
    "loadwatch.daemon.state.records",  # (`plain`: a record as JSON-ready values)
    "loadwatch.daemon.state.published",
    "loadwatch.daemon.state.durations",
    "loadwatch.daemon.state.kvdtype",
    "loadwatch.daemon.sources.inputs",
}


def modules() -> dict[str, Path]:
    out = {}
    for top, pkg in PACKAGES.items():
        for f in sorted((ROOT / top).rglob("*.py")):
            parts = [p for p in f.relative_to(ROOT / top).with_suffix("").parts if p != "__init__"]
            out[".".join([pkg, *parts])] = f
    return out


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("loadwatch"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("loadwatch"))
    return found


@functools.cache
def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: {i for i in imports(f) if i in mods} for m, f in mods.items()}


def is_root(module: str) -> bool:
    """The composition root: the daemon's own top-level modules (the loop and what it wires)
    and the offline tools; every stage lives in a sub-package (sources, state, supervise, sim)."""
    rest = module.removeprefix("loadwatch.daemon.")
    return "." not in rest or rest.startswith("tools.")


def test_the_graph_is_read() -> None:
    g = graph()
    assert len(g) >= 60
    assert "loadwatch.daemon.state.snapshot" in g["loadwatch.exporters.prometheus"]


def test_parsers_depend_on_nothing_of_ours() -> None:
    bad = {m: sorted(d) for m, d in graph().items() if m.startswith("loadwatch.parsers")}
    bad = {m: [x for x in d if not x.startswith("loadwatch.parsers")] for m, d in bad.items()}
    assert {m: d for m, d in bad.items() if d} == {}


def test_what_any_grammar_uses_names_no_grammar() -> None:
    """parsers/*.py (entries, dispatch, recipes, bars, traceback, the scanner, the seam) serve
    every grammar folder; a grammar is found by name (`grammar.load`), never imported there.
    The package's own `__init__` is its public face and may name the default grammar."""
    grammars = {f"loadwatch.parsers.{p.name}" for p in (ROOT / "parsers").iterdir() if p.is_dir()}
    grammars.discard("loadwatch.parsers.__pycache__")
    assert "loadwatch.parsers.vllm" in grammars
    shared = {
        m: d
        for m, d in graph().items()
        if m.startswith("loadwatch.parsers.") and m.count(".") == 2 and m not in grammars
    }
    assert "loadwatch.parsers.traceback" in shared and "loadwatch.parsers.dispatch" in shared
    bad = {
        m: sorted(x for x in d if any(x.startswith(g) for g in grammars)) for m, d in shared.items()
    }
    assert {m: d for m, d in bad.items() if d} == {}


def test_only_the_composition_root_imports_exporters() -> None:
    bad = {
        m: sorted(x for x in deps if x.startswith("loadwatch.exporters"))
        for m, deps in graph().items()
        if m.startswith("loadwatch.daemon") and not is_root(m)
    }
    assert {m: d for m, d in bad.items() if d} == {}


def test_exporters_import_only_the_daemons_value_types() -> None:
    bad = {
        m: sorted(x for x in deps if x.startswith("loadwatch.daemon") and x not in VALUE_MODULES)
        for m, deps in graph().items()
        if m.startswith("loadwatch.exporters")
    }
    assert {m: d for m, d in bad.items() if d} == {}
    # The value modules themselves import no exporter and no runtime.
    g = graph()
    for v in VALUE_MODULES:
        assert not any(x.startswith("loadwatch.exporters") for x in g[v]), v


def test_no_import_cycle_between_daemon_and_exporters() -> None:
    g = graph()
    seen: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(m: str, stack: list[str]) -> list[str] | None:
        seen[m] = 1
        for d in sorted(g[m]):
            if seen.get(d) == 1:
                cycle = [*stack[stack.index(d) :], d] if d in stack else [m, d]
                tops = {x.split(".")[1] for x in cycle}
                if {"daemon", "exporters"} <= tops:
                    return cycle
            elif d not in seen and (found := visit(d, [*stack, d])):
                return found
        seen[m] = 2
        return None

    for m in sorted(g):
        if m not in seen:
            cycle = visit(m, [m])
            assert cycle is None, " -> ".join(cycle)


MODULE_MAX_LINES = 500
CLASS_MAX_LINES = 300


def test_modules_and_classes_stay_small() -> None:
    too_long = []
    for name, path in modules().items():
        src = path.read_text()
        lines = src.count("\n")
        if lines > MODULE_MAX_LINES:
            too_long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > CLASS_MAX_LINES:
                    too_long.append(f"{name}.{node.name}: {size} lines")
    assert len(modules()) > 100 and not too_long, too_long


def is_submodule(package: str, name: str) -> bool:
    """`package.name` is a module of ours (a file, a folder, or a C extension's stub)."""
    top, _, rest = package.removeprefix("loadwatch.").partition(".")
    if top not in PACKAGES:
        return False
    folder = ROOT.joinpath(top, *rest.split(".")) if rest else ROOT / top
    return any((folder / f"{name}{ext}").exists() for ext in (".py", ".pyi", ""))


def private_imports(module: str, path: Path) -> list[str]:
    """The underscore names (not dunders) `module` imports from another module: what a module
    keeps to itself is its own, and a helper two modules share gets a public name."""
    found = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = node.module or ""
        if node.level:  # (relative: resolved against the module's own package)
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            source = f"{base}.{source}" if source else base
        if source == module:
            continue
        for alias in node.names:
            name = alias.name
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                if is_submodule(source, name):
                    continue  # (a package's private module: the C scanner `_scan`)
                found.append(f"{module}:{node.lineno} imports {name} from {source}")
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    bad = [line for name, path in modules().items() for line in private_imports(name, path)]
    assert bad == [], "\n".join(bad)
