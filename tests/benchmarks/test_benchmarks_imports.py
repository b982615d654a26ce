"""benchmarks/ borrows the tests' server helpers, never the other way round: tests/harness.py and
tests/ray_harness.py import nothing of benchmarks/ (nor the app, nor torch), and the benchmarks' modules,
imports inside functions included, form no circle."""

from tests.imports import ROOT, circle, graph, imports, modules

HELPERS = ("harness.py", "ray_harness.py", "imports.py")  # tests/: what benchmarks and tests share


def test_the_shared_helpers_import_no_benchmark_app_or_torch():
    found = [
        f"tests/{helper} imports {m}"
        for helper in HELPERS
        for m in imports(ROOT / "tests" / helper)[0]
        if m.split(".")[0] in ("benchmarks", "app", "torch", "training")
    ]
    assert not found, found


def test_benchmark_modules_form_no_circle():
    found = circle(graph(modules("benchmarks")))
    assert found is None, " -> ".join(found or [])
