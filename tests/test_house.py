"""The house stays readable: product code speaks of what is, decides its experiments, and has no cycles.

Product code is ``reference/``, ``simulator/``, ``kernels/`` and ``megamoe/``. Each check reads the source
as text or through ``ast``; nothing is imported or run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("reference", "simulator", "kernels", "megamoe")
#: The megakernel's @triton.jit body is one function by design (its per-task code is in tile helpers).
LONG_FUNCTION_EXEMPT = {("kernels/megakernel.py", "_megakernel")}
MAX_FUNCTION_LINES = 150
MAX_README_LINES = 200
#: A run, session or commit cited in a comment or docstring ("run AB", "run 64", "session 17", "H200 run").
CITATION = re.compile(r"(\brun[s]? [A-Z]{1,2}\b|\brun ?[0-9]{1,3}\b|\bsession [0-9]+|H[12]00 run)")


def _sources() -> list[Path]:
    return sorted(p for room in ROOMS for p in (ROOT / room).rglob("*.py"))


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def test_no_run_citations_in_product_code():
    hits = [f"{_rel(p)}:{i}: {line.strip()}" for p in _sources()
            for i, line in enumerate(p.read_text().splitlines(), 1) if CITATION.search(line)]
    assert not hits, "product code cites runs or sessions (evidence goes to docs/):\n" + "\n".join(hits[:40])


def test_no_module_switches():
    """No module-level ``USE_*`` option and no ``MEGAMOE_*`` environment variable read at import."""
    hits = []
    for p in _sources():
        tree = ast.parse(p.read_text())
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and t.id.startswith("USE_"):
                    hits.append(f"{_rel(p)}:{node.lineno}: {t.id}")
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                src = ast.get_source_segment(p.read_text(), node) or ""
                if "environ" in src and "MEGAMOE_" in src:
                    hits.append(f"{_rel(p)}:{node.lineno}: reads a MEGAMOE_ variable at import")
    assert not hits, "\n".join(hits)


def _module_name(p: Path) -> str:
    parts = list(p.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _normal(mod: str) -> str:
    """``megamoe.kernels.moe`` -> ``kernels.moe``; ``megamoe.validate`` stays (the front door's own modules)."""
    head, _, rest = mod.partition(".")
    if head == "megamoe" and rest.split(".")[0] in ROOMS[:3]:
        return rest
    return mod


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (annotations only: never run)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    return skip


def _imports(p: Path, name: str) -> set[str]:
    """Every module ``p`` imports, at module level or inside functions, by its name in this tree. A
    submodule's import of its own package (``from . import x``) is an import of ``x``: the parent package
    is always imported first, so that arrow is no cycle."""
    pkg = name if p.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(p.read_text())
    skip = _type_checking_nodes(tree)
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = _normal(node.module or "")
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(_normal(a.name) for a in node.names)
    return {m for m in out if not (name.startswith(m + ".") and p.name != "__init__.py")}


def _graph() -> dict[str, set[str]]:
    mods = {_module_name(p): p for p in _sources()}
    graph = {}
    for name, p in mods.items():
        graph[name] = {m for m in _imports(p, name) if m in mods and m != name and m.split(".")[0] == name.split(".")[0]}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_inside_a_room():
    """A package's ``__init__`` re-exporting its modules is not a cycle unless a module imports it back."""
    graph = _graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_long_functions():
    long = []
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and (_rel(p), node.name) not in LONG_FUNCTION_EXEMPT:
                    long.append(f"{_rel(p)}:{node.lineno} {node.name}: {n} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md is {n} lines (at most {MAX_README_LINES}; history goes to docs/history/)"


@pytest.mark.parametrize("room", ["simulator", "kernels"])
def test_floor_two_rooms_never_touch(room):
    other = {"simulator": "kernels", "kernels": "simulator"}[room]
    hits = [f"{_rel(p)}: imports {other}" for p in (ROOT / room).rglob("*.py")
            if re.search(rf"^\s*(from|import)\s+(megamoe\.)?{other}\b|from \.\.{other}\b", p.read_text(), re.M)]
    assert not hits, "\n".join(hits)


def test_reference_imports_nothing_of_ours():
    hits = [f"{_rel(p)}" for p in (ROOT / "reference").rglob("*.py")
            if re.search(r"^\s*(from|import)\s+(megamoe\.)?(simulator|kernels)\b|from \.\.", p.read_text(), re.M)]
    assert not hits, "\n".join(hits)
