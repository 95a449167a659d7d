"""The modules form layers: no module imports one above it, counting imports inside functions,
so the package's import graph has no cycle, and the decode loop's facade stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "specpipe"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict) -> set[str]:
    """The specpipe modules `name` imports anywhere in its file (a package's own `__init__`,
    which Python runs for any submodule, is not an edge)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            wanted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            subs = [f"{base}.{alias.name}" for alias in node.names]
            wanted = [s for s in subs if s in known] or [base]
        else:
            continue
        for target in wanted:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("specpipe"):
                edges.add(target)
    return edges


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path (depth-first, iterative), or None."""
    state, parent = {}, {}
    for root in sorted(graph):
        if root in state:
            continue
        stack = [(root, iter(sorted(graph[root])))]
        state[root] = "open"
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = "done"
                stack.pop()
            elif state.get(child) == "open":
                path = [node]
                while path[-1] != child:
                    path.append(parent[path[-1]])
                return [*reversed(path), child]
            elif child not in state:
                state[child], parent[child] = "open", node
                stack.append((child, iter(sorted(graph[child]))))
    return None


def test_no_module_imports_one_above_it():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_pipeline_loads_no_build_checks_config_or_hydra():
    """`import specpipe.pipeline` is the library's decode path: the build, the checks and the
    config (and with them Hydra) load only when a config is built."""
    code = ("import sys, specpipe.pipeline; print(sorted(m for m in sys.modules if m.split('.')[0] == 'hydra' or "
            "m in ('specpipe.build', 'specpipe.config', 'specpipe.cli') or m.startswith('specpipe.checks')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=PACKAGE.parent).stdout.strip()
    assert loaded == "[]"


def test_no_folder_imports_one_above_it():
    """At the scale of folders (a subpackage, or a top-level module) the arrows point down too:
    a folder that imports another never reaches it back through a third."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        room = ".".join(name.split(".")[:2])
        graph.setdefault(room, set()).update(".".join(t.split(".")[:2]) for t in imports_of(name, path, known))
    for room, targets in graph.items():
        targets.discard(room)
        for target in targets:
            graph.setdefault(target, set())
    cycle = find_cycle(graph)
    assert cycle is None, "folders import each other: " + " -> ".join(cycle)
