"""`vfkit.bridge.v1_exports`: environment modules export v1 classes lazily, never importing
verifiers until those classes are asked for (vfkit does not depend on verifiers)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from vfkit.testing.child_env import child_env

ROOT = Path(__file__).resolve().parents[1]
HAS_VERIFIERS = importlib.util.find_spec("verifiers") is not None


def _python(code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with reverse-text importable (clean sys.modules).

    The caller's PYTHONPATH is kept: where vfkit's dependencies come from it (`pip install
    --target`), a child without it cannot import openai. It finds verifiers only where this
    process does, which is what HAS_VERIFIERS checks."""
    env = child_env(ROOT, ROOT / "environments" / "reverse-text")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize("installed", [True, False])
def test_environment_modules_declare_the_v1_names_when_verifiers_v1_is_installed(
    installed: bool, monkeypatch
) -> None:
    import vfkit.bridge as bridge

    monkeypatch.setattr(bridge, "has_verifiers_v1", lambda: installed)
    names, getattr_ = bridge.v1_exports("x", lambda: None)
    assert names == ["load_environment", *(bridge.V1_NAMES if installed else ())]
    with pytest.raises(AttributeError, match="nope"):
        getattr_("nope")


def test_importing_an_environment_never_imports_verifiers() -> None:
    done = _python("import sys, vfkit_reverse_text as m; m.load_environment(num_train_examples=2)"
                   "; print('verifiers' in sys.modules, m.__all__)")
    assert done.returncode == 0, done.stderr
    from vfkit.bridge import V1_NAMES, has_verifiers_v1

    exported = ["load_environment", *(V1_NAMES if has_verifiers_v1() else ())]
    assert done.stdout.strip() == f"False {exported}"


@pytest.mark.skipif(HAS_VERIFIERS, reason="verifiers is installed here")
def test_a_star_import_of_an_environment_works_without_verifiers() -> None:
    done = _python("from vfkit_reverse_text import *; print(load_environment.__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "load_environment"


@pytest.mark.skipif(HAS_VERIFIERS, reason="verifiers is installed here")
def test_asking_for_a_v1_class_without_verifiers_says_what_to_install() -> None:
    done = _python("import vfkit_reverse_text as m; m.VfkitTaskset")
    assert done.returncode != 0
    assert "ImportError" in done.stderr and "pip install 'vfkit[verifiers]'" in done.stderr
