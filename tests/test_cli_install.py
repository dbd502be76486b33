"""vf-install: finds environments/NAME, pip-installs it editable, explains what is missing."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from vfkit.cli.init import init_environment
from vfkit.cli.install import find_package, main, pip_command
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


@pytest.mark.slow
def test_install_makes_the_environment_loadable(tmp_path: Path) -> None:
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
