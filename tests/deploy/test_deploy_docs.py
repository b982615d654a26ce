"""The deployment files and the docs say the same as the code: every setting is documented in
docs/serving.md and passed through by compose, the README's test command is the one CI runs, and
`make` lists its targets."""

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from app.settings import Settings

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
SERVING = (REPO / "docs" / "serving.md").read_text()
NOT_PASSED = {"host", "port"}  # fixed by the image


def demo_settings_fields() -> list[str]:
    tree = ast.parse((REPO / "frontend" / "settings.py").read_text())
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "DemoSettings"]
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)]


def test_serving_doc_documents_every_setting():
    missing = [f"CAPSNET_{f.upper()}" for f in Settings.model_fields if f"CAPSNET_{f.upper()}" not in SERVING]
    missing += [
        f"CAPSNET_DEMO_{f.upper()}" for f in demo_settings_fields() if f"CAPSNET_DEMO_{f.upper()}" not in SERVING
    ]
    assert not missing, f"docs/serving.md does not document {missing}"


def test_compose_passes_every_api_setting_through():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    env = compose["services"]["api"]["environment"]
    want = {f"CAPSNET_{f.upper()}" for f in Settings.model_fields if f not in NOT_PASSED}
    assert want <= set(env), f"docker-compose.yml does not pass {sorted(want - set(env))}"
    for name in want:
        # empty: Settings' default (the workers: one per core, at most GPU_WORKERS on a GPU)
        assert env[name] == f"${{{name}:-}}", f"{name}: {env[name]}"


def test_compose_passes_every_demo_setting_through():
    env = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["frontend"]["environment"]
    want = {f"CAPSNET_DEMO_{f.upper()}" for f in demo_settings_fields() if f not in NOT_PASSED}
    assert want <= set(env), f"docker-compose.yml does not pass {sorted(want - set(env))} to the demo"
    own = {"CAPSNET_DEMO_API_URL", "CAPSNET_DEMO_PUBLIC_API_URL"}  # compose's names for the API: its own values
    assert all(env[name] == f"${{{name}:-}}" for name in want - own), env


def fresh_machine_commands() -> list[str]:
    """The commands of the README's 'Two commands on a fresh machine' block, comments stripped."""
    section = README.split("## Two commands on a fresh machine", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))


def test_readme_gives_two_set_up_commands_and_ci_runs_its_test_command():
    commands = fresh_machine_commands()
    assert len(commands) == 2, commands
    demo, test = commands
    assert test.split()[0] == demo.split()[0] == "make" and {demo.split()[1], test.split()[1]} <= make_targets()
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert test in ci_lines, f"README's test command {test!r} is not what .ci/run runs"
    assert "make docker-smoke" in ci_lines


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_alone_lists_every_target_with_its_words():
    """`make` with no target is `make help`: one line per target, its name and the words after its `##`."""
    described = dict(re.findall(r"^([\w-]+):[^#\n]*## (.+)$", (REPO / "Makefile").read_text(), re.M))
    assert set(described) == make_targets(), "every target has its ## words"
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(REPO)], capture_output=True, text=True, check=True
    ).stdout
    listed = dict(line.strip().split(None, 1) for line in out.splitlines())
    assert listed == {target: words.strip() for target, words in described.items()}
