"""The deployment files and the README say the same as the code: every setting is documented and
passed through by compose, and the README's test command is the one CI runs."""
import ast
import re
from pathlib import Path

import yaml

from app.settings import Settings

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
NOT_PASSED = {"host", "port", "model_dir"}  # fixed by the image


def demo_settings_fields() -> list[str]:
    tree = ast.parse((REPO / "frontend" / "app.py").read_text())
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "DemoSettings"]
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)]


def test_readme_documents_every_setting():
    missing = [f"CAPSNET_{f.upper()}" for f in Settings.model_fields if f"CAPSNET_{f.upper()}" not in README]
    missing += [f"CAPSNET_DEMO_{f.upper()}" for f in demo_settings_fields() if f"CAPSNET_DEMO_{f.upper()}" not in README]
    assert not missing, f"README.md does not document {missing}"


def test_compose_passes_every_api_setting_through():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    env = compose["services"]["api"]["environment"]
    want = {f"CAPSNET_{f.upper()}" for f in Settings.model_fields if f not in NOT_PASSED}
    assert want <= set(env), f"docker-compose.yml does not pass {sorted(want - set(env))}"
    for name in want:
        assert env[name] == f"${{{name}:-}}" or name == "CAPSNET_PROVIDERS", f"{name}: {env[name]}"


def test_readme_test_command_is_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M) and re.search(r"^make docker-smoke$", ci, re.M)
    assert "make test    # the test suite: the same command CI (.ci/run) runs" in README
    assert "make demo" in README
