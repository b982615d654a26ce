"""training/ is a pipeline whose imports run one way (docs/ARCHITECTURE.md, "Who imports whom"): it
imports model/ and itself, never the service, the benchmarks or the demo; no module imports another
inside a function to hold a circle open; and its modules' imports form no circle."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAINING = ROOT / "training"
FOREIGN = ("app", "benchmarks", "frontend", "tests", "tools")  # rooms training/ may not import


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(TRAINING.rglob("*.py"))}


def imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement names: `from training import data` names training.data where
    that is a module, else training."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def imports(path: Path) -> tuple[set[str], list[tuple[int, str]]]:
    """(every module the file imports, (line, module) of the project modules it imports inside a function)."""
    tree = ast.parse(path.read_text())
    every: set[str] = set()
    local: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    project = [m for m in imported(inner) if m.split(".")[0] in ("training", "model", *FOREIGN)]
                    local += [(inner.lineno, m) for m in project]
        if isinstance(node, ast.Import | ast.ImportFrom):
            every.update(imported(node))
    return every, local


def test_training_imports_no_other_room_but_model():
    found = [
        f"{name} imports {m}" for name, path in MODULES.items() for m in imports(path)[0] if m.split(".")[0] in FOREIGN
    ]
    assert not found, found


def test_no_function_imports_a_project_module():
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {m}" for path in MODULES.values() for line, m in imports(path)[1]
    ]
    assert not found, found


def circle(graph: dict[str, list[str]]) -> list[str] | None:
    """A circle of the import graph (module -> the modules it imports), as the path that closes it, or None."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for nxt in graph.get(name, []):
            if state.get(nxt) == 1:
                return [*path, name, nxt]
            if nxt not in state and (found := walk(nxt, [*path, name])):
                return found
        state[name] = 2
        return None

    return next((found for name in graph if name not in state and (found := walk(name, []))), None)


def test_training_modules_form_no_circle():
    graph = {name: sorted(m for m in imports(path)[0] if m in MODULES and m != name) for name, path in MODULES.items()}
    found = circle(graph)
    assert found is None, " -> ".join(found or [])


def test_the_rules_see_a_circle_and_a_local_import(tmp_path):
    """The checks above catch what they are for: a module made to break them, and a graph with a circle."""
    (tmp_path / "b.py").write_text("from model import contract\n\n\ndef f():\n    from training import data\n")
    every, local = imports(tmp_path / "b.py")
    assert every == {"model", "training.data"} and local == [(5, "training.data")]
    assert circle({"a": ["b"], "b": ["c"], "c": ["a"], "d": []}) == ["a", "b", "c", "a"]
    assert circle({"a": ["b", "c"], "b": ["c"], "c": []}) is None
