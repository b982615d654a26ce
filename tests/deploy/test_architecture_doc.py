"""docs/ARCHITECTURE.md stays true: every repository path it quotes in backticks or links to exists, and
every dotted name it quotes from the service (`imaging.decode`, `Engine.predict`, `contract.SHIPPED`)
names a module, function, class or class member that is there. Read from the source (ast), nothing imported."""

import ast
import re
from functools import cache
from pathlib import Path

from tests.imports import ROOT

DOC = ROOT / "docs" / "ARCHITECTURE.md"
TEXT = DOC.read_text()
QUOTED = set(re.findall(r"`([^`\n]+)`", TEXT))
LINKS = set(re.findall(r"\]\(([^)\s#]+)", TEXT))
TRACKED = ("app", "benchmarks", "deploy", "docs", "frontend", "model", "models", "tests", "training", ".ci")
FILE_TYPES = ("py", "onnx", "json", "md", "yml", "yaml", "toml")  # `workers.py` is a file name, not a member
SERVICE = [*sorted((ROOT / "app").rglob("*.py")), ROOT / "model" / "contract.py", ROOT / "model" / "card.py"]


def expand(path: str) -> list[str]:
    """model/{__init__,contract}.py -> model/__init__.py, model/contract.py."""
    brace = re.search(r"\{([^}]*)\}", path)
    if brace is None:
        return [path]
    return [p for part in brace.group(1).split(",") for p in expand(path[: brace.start()] + part + path[brace.end() :])]


def quoted_paths() -> set[str]:
    """The backticked repository paths: a tracked top-level folder, then more of a path (no placeholders)."""
    pattern = r"\.?[\w.-]+(/[\w.{},-]*)+"
    return {p for q in QUOTED if re.fullmatch(pattern, q) and q.split("/")[0] in TRACKED for p in expand(q)}


def exists(path: Path) -> bool:
    """A file or folder, or a module named without its .py (`training/triton`)."""
    return path.exists() or path.with_suffix(".py").is_file()


@cache
def top_level(path: Path) -> dict[str, ast.stmt | None]:
    """A module's own names: its functions and classes (their nodes), its assignments and imports (None)."""
    names: dict[str, ast.stmt | None] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id: None for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0]: None for a in node.names}
    return names


def members(cls: ast.ClassDef) -> set[str]:
    """A class's methods and properties, its class-level fields and what its methods assign to self."""
    found = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.add(node.name)
        elif isinstance(node, ast.AnnAssign | ast.Assign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name) and node in cls.body:
                        found.add(t.id)
                    elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        found.add(t.attr)
    return found


MODULES = {(p.parent.name if p.name == "__init__.py" else p.stem): p for p in SERVICE if p.stem != "__main__"}
CLASSES = {n: node for p in SERVICE for n, node in top_level(p).items() if isinstance(node, ast.ClassDef)}


def unresolved(name: str) -> str | None:
    """Why a dotted service name does not resolve (None when it does, or when it is not the service's)."""
    parts = name.split(".")
    if parts[0] in MODULES:
        path, rest = MODULES[parts[0]], parts[1:]
        submodule = path.parent / f"{rest[0]}.py"
        if path.name == "__init__.py" and rest[0] not in top_level(path) and submodule.is_file():
            path, rest = submodule, rest[1:]  # imaging.decode where the package does not export it
            if not rest:
                return None
        node = top_level(path).get(rest[0], False)
        if node is False:
            return f"{path.relative_to(ROOT)} has no {rest[0]}"
        return unresolved(".".join([rest[0], *rest[1:]])) if len(rest) > 1 and rest[0] in CLASSES else None
    if parts[0] in CLASSES and len(parts) > 1 and parts[1] not in members(CLASSES[parts[0]]):
        return f"class {parts[0]} has no {parts[1]}"
    return None


def test_quoted_and_linked_paths_exist():
    missing = [p for p in sorted(quoted_paths()) if not exists(ROOT / p)]
    missing += [link for link in sorted(LINKS) if "://" not in link and not exists(DOC.parent / link)]
    assert not missing, f"docs/ARCHITECTURE.md names paths that are not there: {missing}"


def test_quoted_service_names_resolve():
    dotted = r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+"
    names = {re.sub(r"\(.*\)$", "", q) for q in QUOTED if re.fullmatch(dotted + r"(\(.*\))?", q)}
    wrong = {n: why for n in sorted(names) if n.rsplit(".", 1)[1] not in FILE_TYPES and (why := unresolved(n))}
    assert not wrong, f"docs/ARCHITECTURE.md quotes names the code does not have: {wrong}"


def test_the_checks_see_a_wrong_name_and_a_missing_path():
    assert unresolved("imaging.decode") is None and unresolved("Engine.predict") is None
    assert unresolved("imaging.nowhere") and unresolved("Engine.nowhere") and unresolved("engine.Engine.nowhere")
    assert unresolved("export.SERVED") is None  # not the service's: not checked here
    assert expand("model/{__init__,contract}.py") == ["model/__init__.py", "model/contract.py"]
    assert not exists(ROOT / "app" / "nowhere.py") and exists(ROOT / "training" / "triton")
