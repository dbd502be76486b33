"""load_environment / list_environments: modules, entry points, environments/ folders, errors."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from vfkit.envs.registry import list_environments, load_environment
from vfkit.errors import EnvironmentNotFoundError

ENV_MODULE = """
import vfkit as vf

def load_environment(n: int = 2, **kwargs):
    rows = [{"question": str(i), "answer": str(i)} for i in range(n)]
    return vf.SingleTurnEnv(dataset=rows, **kwargs)
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A throwaway import path with a module `toy_env` and a dist advertising `ep-env`."""
    (tmp_path / "toy_env.py").write_text(ENV_MODULE)
    (tmp_path / "ep_impl.py").write_text(ENV_MODULE.replace("def load_environment",
                                                           "def build"))
    dist = tmp_path / "ep_env-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-env\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[vfkit.environments]\nep-env = ep_impl:build\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in ("toy_env", "ep_impl", "broken_env"):
        sys.modules.pop(name, None)


def test_load_by_module_name_sets_id_and_args(site):
    env = load_environment("toy-env", n=3)
    assert env.env_id == "toy-env" and env.env_args == {"n": 3}
    assert len(env.get_dataset()) == 3


def test_load_by_entry_point(site):
    env = load_environment("ep-env", n=1)
    assert env.env_id == "ep-env" and len(env.get_dataset()) == 1
    assert "ep-env" in list_environments()


def test_environments_folder_is_listed(site):
    pkg = site / "environments" / "word_count"
    pkg.mkdir(parents=True)
    (pkg / "pyproject.toml").write_text('[project]\nname = "word-count"\n')
    assert "word-count" in list_environments()


def test_missing_environment_lists_known_ones_and_the_install_command(site):
    with pytest.raises(EnvironmentNotFoundError) as err:
        load_environment("no-such-env")
    message = str(err.value)
    assert "'no-such-env' not found" in message and "vf-install <id>" in message
    assert "ep-env" in message and "Did you mean" not in message
    with pytest.raises(EnvironmentNotFoundError) as err:
        load_environment("ep-envv")  # a typo of a known id: named, and not "vf-install ep-envv"
    assert "Did you mean 'ep-env'?" in str(err.value)
    assert "vf-install ep-envv" not in str(err.value)


def test_a_package_folder_not_installed_yet_gets_its_install_command(site):
    pkg = site / "environments" / "word_count"
    pkg.mkdir(parents=True)
    (pkg / "pyproject.toml").write_text('[project]\nname = "word-count"\n')
    with pytest.raises(EnvironmentNotFoundError, match="vf-install word-count"):
        load_environment("word-count")


def test_a_missing_dependency_inside_the_environment_is_not_hidden(site):
    (site / "broken_env.py").write_text(textwrap.dedent("""
        import some_dependency_that_is_not_installed
        def load_environment(): ...
    """))
    with pytest.raises(ModuleNotFoundError, match="some_dependency_that_is_not_installed"):
        load_environment("broken-env")


def test_module_without_loader_is_reported(site):
    (site / "empty_env.py").write_text("x = 1\n")
    with pytest.raises(EnvironmentNotFoundError, match="no load_environment"):
        load_environment("empty-env")
    sys.modules.pop("empty_env", None)
