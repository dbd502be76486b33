"""vf-init: the scaffold is a valid package whose own tests pass before anything is edited."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from vfkit.cli.init import check_name, init_environment, main
from vfkit.errors import ConfigError
from vfkit.evaluation.defaults import read_eval_defaults


def test_scaffold_files_and_metadata(tmp_path: Path, capsys) -> None:
    assert main(["word-count", "--path", str(tmp_path)]) == 0
    folder = tmp_path / "word-count"
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files == ["README.md", "pyproject.toml", "tests/test_word_count.py", "word_count.py"]
    meta = tomllib.loads((folder / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "vfkit-word-count"  # pip never replaces a real package
    assert meta["project"]["dependencies"] == ["vfkit"]
    eps = meta["project"]["entry-points"]["vfkit.environments"]
    assert eps == {"word-count": "word_count:load_environment"}
    assert meta["tool"]["setuptools"]["py-modules"] == ["word_count"]
    assert read_eval_defaults(folder / "pyproject.toml") == {
        "num_examples": 20, "rollouts_per_example": 4}
    assert "vf-install word-count" in capsys.readouterr().out


@pytest.mark.slow
def test_scaffold_passes_its_own_tests(tmp_path: Path) -> None:
    folder = init_environment("fresh-env", tmp_path / "environments")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout


@pytest.mark.parametrize("bad", ["Word", "1abc", "word count", "word--count", "os", "class", ""])
def test_invalid_names_are_refused(bad: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(ConfigError):
        check_name(bad)
    assert main([bad, "--path", str(tmp_path)]) == 1
    assert "error:" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_existing_folder_needs_force(tmp_path: Path, capsys) -> None:
    folder = init_environment("my-env", tmp_path)
    (folder / "my_env.py").write_text("# edited\n")
    assert main(["my-env", "--path", str(tmp_path)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert (folder / "my_env.py").read_text() == "# edited\n"  # untouched
    assert main(["my-env", "--path", str(tmp_path), "--force"]) == 0
    assert "def load_environment" in (folder / "my_env.py").read_text()


@pytest.mark.parametrize("taken", ["datasets", "numpy", "pytest"])
def test_a_name_whose_module_is_installed_is_refused(taken: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"environment name '{taken}' would shadow the "
                       rf"installed module '{taken}' \(.*\); pick another name, e.g. {taken}-env"):
        init_environment(taken, tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_name_that_normalises_to_a_siblings_module_is_refused(tmp_path: Path) -> None:
    init_environment("my-env", tmp_path)
    with pytest.raises(ConfigError, match=r"environment name 'my_env' names the same module "
                       r"'my_env' as the existing .*my-env; use 'my-env' or another name"):
        init_environment("my_env", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-env"]


def test_force_may_rewrite_an_installed_scaffold(tmp_path: Path, monkeypatch) -> None:
    folder = init_environment("own-env", tmp_path)
    monkeypatch.syspath_prepend(str(folder))  # as `vf-install own-env` (editable) makes it
    assert init_environment("own-env", tmp_path, force=True) == folder


@pytest.mark.parametrize("line_length", ["88", "100"])  # ruff's default, vfkit's
def test_generated_python_is_ruff_clean(line_length: str, tmp_path: Path) -> None:
    pytest.importorskip("ruff")
    folder = init_environment("a-rather-long-environment-name", tmp_path)
    for args in (["format", "--check"], ["check"]):
        run = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "--isolated", "--line-length", line_length,
             str(folder)], capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
