"""vfkit's environment packages never collide with verifiers' packages of the same id.

verifiers ships its own `reverse-text` / `gsm8k` environment packages (modules `reverse_text`,
`gsm8k`); vfkit's are `vfkit-<id>` distributions with `vfkit_<id>` modules, and the env id alone
still finds them.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

import vfkit as vf

ROOT = Path(__file__).resolve().parents[1] / "environments"


def test_no_shipped_module_or_distribution_takes_a_bare_id() -> None:
    for pyproject in ROOT.glob("*/pyproject.toml"):
        meta = tomllib.loads(pyproject.read_text())
        modules = meta["tool"]["setuptools"].get("py-modules", []) + meta["tool"][
            "setuptools"].get("packages", [])
        assert meta["project"]["name"].startswith("vfkit-"), pyproject
        assert modules and all(m.startswith("vfkit_") for m in modules), pyproject


def test_the_id_finds_vfkit_s_module_even_when_a_same_named_one_is_importable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a stand-in for verifiers' own `reverse_text` package, installed side by side
    (tmp_path / "reverse_text.py").write_text(
        "def load_environment(**kwargs):\n    raise RuntimeError('verifiers reverse_text')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(ROOT / "reverse-text"))
    for name in ("reverse_text", "vfkit_reverse_text"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    env = vf.load_environment("reverse-text", num_train_examples=3, num_eval_examples=2)
    assert type(env).__module__.startswith("vfkit")
    assert env.env_id == "reverse-text" and len(env.get_eval_dataset()) == 2
    assert sys.modules["vfkit_reverse_text"].load_environment  # the vfkit package answered


def test_a_stale_entry_point_reads_as_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the rename, an old install's entry point names a module that is gone."""
    from importlib.metadata import EntryPoint

    from vfkit.envs import registry

    stale = EntryPoint(name="ghost-env", value="ghost_env:load_environment",
                       group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "_entry_points", lambda: {"ghost-env": stale})
    with pytest.raises(vf.EnvironmentNotFoundError, match="vf-install ghost-env"):
        vf.load_environment("ghost-env")
