"""`make lint`, .ci/run and pre-commit run the same checks, so a commit, CI and a newcomer's machine agree."""

import re

import yaml

from tests.harness import REPO


def lint_commands() -> list[str]:
    """The commands of the Makefile's lint target, without the venv's path."""
    target = re.search(r"^lint:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M)
    assert target, "the Makefile has no lint target"
    return [line.strip().removeprefix("$(BIN)/") for line in target.group(1).splitlines()]


def test_ci_lints_before_it_tests():
    steps = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.startswith("make ")]
    assert steps.index("make lint") < steps.index("make test")


def test_pre_commit_runs_what_make_lint_runs():
    assert lint_commands() == ["ruff check .", "ruff format --check .", "mypy"]
    hooks = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    entries = [hook["entry"].removeprefix(".venv/bin/").replace(" --force-exclude", "") for hook in hooks]
    assert [e + " ." if e.startswith("ruff") else e for e in entries] == lint_commands()
