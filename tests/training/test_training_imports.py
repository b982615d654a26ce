"""training/ is a pipeline whose imports run one way (docs/ARCHITECTURE.md, "Who imports whom"): it
imports model/ and itself, never the service, the benchmarks or the demo; no module imports another
inside a function to hold a circle open; and its modules' imports form no circle."""

from tests.imports import ROOT, circle, graph, imports, modules

MODULES = modules("training")
FOREIGN = ("app", "benchmarks", "frontend", "tests")  # rooms training/ may not import


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


def test_training_modules_form_no_circle():
    found = circle(graph(MODULES))
    assert found is None, " -> ".join(found or [])
