"""app/ is the service, and its imports run one way (docs/ARCHITECTURE.md, "Who imports whom"): it imports
model/ and itself, never training/, benchmarks/, tests/ or the demo; a route reads its request and calls
app/answer.py, never another route; the engine keeps sessions and batching, below the answer; no module
imports another inside a function; and the modules form no circle."""

from tests.imports import ROOT, circle, graph, imports, modules

APP = modules("app")
FOREIGN = ("training", "benchmarks", "tests", "frontend")  # rooms app/ may not import
ROUTES = {name for name in APP if name.startswith("app.routes.")}
IMAGE_ROUTES = ("app.routes.predict", "app.routes.explain", "app.routes.reconstruct")  # their answers: app.answer
ANSWER = "app.answer"
EDGES = graph(APP)


def test_app_imports_no_other_room_but_model():
    found = [
        f"{name} imports {m}" for name, path in APP.items() for m in imports(path)[0] if m.split(".")[0] in FOREIGN
    ]
    assert not found, found


def test_no_function_imports_a_project_module():
    found = [f"{path.relative_to(ROOT)}:{line} imports {m}" for path in APP.values() for line, m in imports(path)[1]]
    assert not found, found


def test_routes_import_the_answer_not_each_other():
    between = [f"{name} imports {m}" for name in ROUTES for m in EDGES[name] if m in ROUTES]
    assert not between, between
    assert all(ANSWER in EDGES[name] for name in IMAGE_ROUTES)


def test_only_the_app_factory_imports_the_routes():
    importers = {name for name, edges in EDGES.items() for m in edges if m in ROUTES} - ROUTES
    assert importers == {"app.main"}, importers


def test_the_answer_is_built_above_the_engine():
    """The answer module calls the engine; the engine (and what it imports) knows nothing of answers or routes."""
    below = {"app.engine"}
    while grown := {m for name in below for m in EDGES[name]} - below:
        below |= grown
    assert ANSWER in APP and not below & ({ANSWER, "app.couplings", "app.image_request"} | ROUTES), below


def test_app_modules_form_no_circle():
    found = circle(EDGES)
    assert found is None, " -> ".join(found or [])


def test_the_rules_see_app_modules_a_circle_and_a_local_import(tmp_path):
    """The helpers resolve `from app import imaging` to the package's module, and find what the checks are for."""
    (tmp_path / "b.py").write_text("from app import VERSION, imaging\n\n\ndef f():\n    from training import data\n")
    every, local = imports(tmp_path / "b.py")
    assert every == {"app", "app.imaging", "training.data"} and local == [(5, "training.data")]
    assert circle({"a": ["b"], "b": ["c"], "c": ["a"], "d": []}) == ["a", "b", "c", "a"]
    assert circle({"a": ["b", "c"], "b": ["c"], "c": []}) is None
