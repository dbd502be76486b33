"""vf-install: finds environments/NAME, pip-installs it editable, explains what is missing;
offline (PIP_NO_INDEX=1: pip cannot fetch the build backend) it builds with the backend
installed here, or names the backend to install."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from vfkit.cli.init import init_environment
from vfkit.cli.install import find_package, main, missing_build_requirements, pip_command
from vfkit.errors import EnvironmentNotFoundError


def test_missing_environment_is_a_clear_error(tmp_path: Path, capsys) -> None:
    init_environment("present-env", tmp_path)
    assert main(["absent-env", "--path", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "no environment package 'absent-env'" in err
    assert "found: present-env" in err
    assert "vf-init absent-env" in err
    assert "Traceback" not in err


def test_dashes_and_underscores_are_interchangeable(tmp_path: Path) -> None:
    folder = init_environment("two-words", tmp_path)
    assert find_package("two_words", tmp_path) == folder
    assert find_package("two-words", tmp_path) == folder
    with pytest.raises(EnvironmentNotFoundError):
        find_package("two-words", tmp_path / "elsewhere")


def test_pip_command_targets_this_interpreter(tmp_path: Path) -> None:
    assert pip_command(tmp_path) == [
        sys.executable, "-m", "pip", "install", "-q", "-e", str(tmp_path)
    ]
    assert "-q" not in pip_command(tmp_path, verbose=True)
    assert pip_command(tmp_path, editable=False)[-1] == str(tmp_path)
    assert pip_command(tmp_path, build_isolation=False)[-3:] == [
        "--no-build-isolation", "-e", str(tmp_path)
    ]


def _pyproject(folder: Path, build_system: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(f"{build_system}[project]\nname = 'x'\n")
    return folder


def test_missing_build_requirements_are_checked_against_this_interpreter(tmp_path: Path) -> None:
    def missing(requires: str) -> list[str]:
        folder = _pyproject(tmp_path / uuid.uuid4().hex, f"[build-system]\nrequires = {requires}\n")
        return missing_build_requirements(folder)

    assert missing('["setuptools>=68"]') == []
    assert missing('["setuptools>=68", "vfkit-no-such-backend>=1"]') == ["vfkit-no-such-backend>=1"]
    [too_old] = missing('["setuptools>=9999"]')
    assert too_old.startswith("setuptools>=9999 (installed: ")
    assert missing('["vfkit-no-such-backend; python_version < \'3\'"]') == []  # not for us
    # no [build-system]: pip's default, setuptools
    assert missing_build_requirements(_pyproject(tmp_path / "none", "")) == []


def test_offline_without_the_build_backend_the_error_says_what_to_install(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline: pip cannot fetch build requirements
    build_system = ('[build-system]\nrequires = ["vfkit-no-such-backend>=1"]\n'
                    'build-backend = "vfkit_no_such_backend"\n')
    _pyproject(tmp_path / "needs-backend", build_system)
    assert main(["needs-backend", "--path", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "without build isolation" not in out  # no second try: the backend is not here
    assert f"install vfkit-no-such-backend>=1 for {sys.executable}" in err
    assert "Traceback" not in err


def _install_and_load(tmp_path: Path) -> None:
    """vf-install a fresh vf-init package, load it from a fresh interpreter, uninstall it."""
    name = f"probe-{uuid.uuid4().hex[:8]}"
    module = name.replace("-", "_")
    init_environment(name, tmp_path / "environments")
    probe = ("import vfkit, sys; env = vfkit.load_environment(sys.argv[1]); "
             "print(type(env).__name__, len(env.get_dataset()))")
    try:
        assert main([name, "--path", str(tmp_path / "environments")]) == 0
        # a fresh interpreter elsewhere (not the package folder) finds it via its entry point
        out = subprocess.run([sys.executable, "-c", probe, name], cwd="/", capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["SingleTurnEnv", "8"]
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", f"vfkit-{name}"],
                       capture_output=True, timeout=120)  # vf-init's distribution name
    gone = subprocess.run([sys.executable, "-c", f"import {module}"], cwd="/",
                          capture_output=True, timeout=60)
    assert gone.returncode != 0  # uninstalled: nothing left behind in the venv


@pytest.mark.slow
def test_install_makes_the_environment_loadable(tmp_path: Path) -> None:
    _install_and_load(tmp_path)


@pytest.mark.slow
def test_offline_install_builds_with_the_backend_installed_here(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline: the isolated build cannot get setuptools
    _install_and_load(tmp_path)
    out = capsys.readouterr().out
    assert "trying again without build isolation" in out
    assert "--no-build-isolation" in out
