"""Every package under environments/ is complete: metadata, entry point, module, README, tests."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from vfkit.evaluation.defaults import read_eval_defaults

ROOT = Path(__file__).resolve().parents[1] / "environments"
PACKAGES = sorted(p.parent for p in ROOT.glob("*/pyproject.toml"))


def test_the_issue_environments_are_all_there() -> None:
    names = {p.name for p in PACKAGES}
    assert {"reverse-text", "arithmetic", "gsm8k", "guess-number", "calculator",
            "python-sandbox"} <= names


@pytest.mark.parametrize("folder", PACKAGES, ids=lambda p: p.name)
def test_package_metadata(folder: Path) -> None:
    meta = tomllib.loads((folder / "pyproject.toml").read_text())
    project = meta["project"]
    module = "vfkit_" + folder.name.replace("-", "_")  # never shadows verifiers' own packages
    assert project["name"] == f"vfkit-{folder.name}"
    assert "vfkit" in project["dependencies"]  # unpinned: satisfied by the local install
    assert project["entry-points"]["vfkit.environments"] == {
        folder.name: f"{module}:load_environment"}
    assert (folder / f"{module}.py").is_file() or (folder / module / "__init__.py").is_file()
    assert read_eval_defaults(folder / "pyproject.toml") == {
        "num_examples": 20, "rollouts_per_example": 4}
    assert (folder / "README.md").read_text().startswith(f"# {folder.name}")
    assert (folder / "tests" / f"test_{module}.py").is_file()  # unique basename for pytest


def test_test_file_basenames_are_unique() -> None:
    names = [p.name for p in ROOT.glob("*/tests/*.py")]
    assert len(names) == len(set(names))
