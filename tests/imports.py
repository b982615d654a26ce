"""A folder's import graph read from its source (ast), for the tests that hold a room's imports to its rules
(tests/app/test_app_imports.py, tests/benchmarks/test_benchmarks_imports.py): what each module imports, at
its top or inside a function, and a circle in the graph."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("app", "benchmarks", "frontend", "model", "tests", "training")  # the project's top-level packages


def module_name(path: Path) -> str:
    """app/routes/predict.py -> app.routes.predict; a package's __init__.py -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(folder: str) -> dict[str, Path]:
    """Every module under ROOT/folder by its dotted name."""
    return {module_name(p): p for p in sorted((ROOT / folder).rglob("*.py"))}


def is_module(name: str) -> bool:
    parts = name.split(".")
    return (ROOT.joinpath(*parts).with_suffix(".py")).is_file() or (ROOT.joinpath(*parts) / "__init__.py").is_file()


def imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement names: `from app import imaging` names app.imaging where that is a
    module, else app."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    return [f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base for a in node.names]


def imports(path: Path) -> tuple[set[str], list[tuple[int, str]]]:
    """(every module the file imports, (line, module) of the project modules it imports inside a function)."""
    tree = ast.parse(path.read_text())
    every: set[str] = set()
    local: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    local += [(inner.lineno, m) for m in imported(inner) if m.split(".")[0] in ROOMS]
        if isinstance(node, ast.Import | ast.ImportFrom):
            every.update(imported(node))
    return every, local


def graph(found: dict[str, Path]) -> dict[str, list[str]]:
    """module -> the modules among `found` that it imports (anywhere in it)."""
    return {name: sorted(m for m in imports(path)[0] if m in found and m != name) for name, path in found.items()}


def circle(edges: dict[str, list[str]]) -> list[str] | None:
    """A circle of an import graph (module -> the modules it imports), as the path that closes it, or None."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for nxt in edges.get(name, []):
            if state.get(nxt) == 1:
                return [*path, name, nxt]
            if nxt not in state and (found := walk(nxt, [*path, name])):
                return found
        state[name] = 2
        return None

    return next((found for name in edges if name not in state and (found := walk(name, []))), None)
