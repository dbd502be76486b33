"""vfkit/precision.py: bf16 only where the device has bf16 units, for trainer, server and plan.

Which CPU this is cannot be chosen in a test, so the one probe of the hardware
(`cpu_supports_bf16`) reads a cpuinfo file written here, or is set by monkeypatch; every
decision made from it is the real code's.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from vfkit import precision
from vfkit.launch.plan import precision as plan_precision
from vfkit.serve.model import choose_dtype
from vfkit.train.config_loader import load_config
from vfkit.train.learner import trainer_bf16

REPO = Path(__file__).resolve().parents[1]
ZEN3 = "flags\t\t: fpu sse sse2 avx avx2 fma bmi2 sha_ni vaes vpclmulqdq\n"
ZEN4 = ZEN3.rstrip() + " avx512f avx512bw avx512_bf16\n"
SAPPHIRE_RAPIDS = ZEN3.rstrip() + " avx512f amx_tile amx_bf16 amx_int8\n"


@pytest.mark.parametrize(("cpuinfo", "native"), [
    (ZEN3, False), (ZEN4, True), (SAPPHIRE_RAPIDS, True),
    (ZEN3.rstrip() + " avx512_bf16_extra\n", False),  # a whole flag, not a substring
])
def test_cpu_bf16_is_read_from_the_cpu_flags(tmp_path: Path, cpuinfo: str, native: bool) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert precision.cpu_supports_bf16(path) is native


def test_no_cpuinfo_means_no_bf16(tmp_path: Path) -> None:
    assert precision.cpu_supports_bf16(tmp_path / "missing") is False


@pytest.mark.parametrize("native", [True, False])
def test_auto_follows_the_device_and_explicit_settings_win(
    monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: native)
    assert precision.resolve_bf16("auto", "cpu") is native
    assert precision.resolve_bf16(True, "cpu") is True
    assert precision.resolve_bf16(False, "cpu") is False
    assert precision.resolve_bf16("auto", "mps") is False  # no claim about other devices
    assert choose_dtype("auto", "cpu") == (torch.bfloat16 if native else torch.float32)


def _args(*overrides: str):
    return load_config(REPO / "configs" / "exp.toml", list(overrides)).trainer.args


def test_exp_toml_trains_in_bf16_only_on_a_cpu_with_bf16_units(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _args().bf16 == "auto"
    for native in (True, False):
        monkeypatch.setattr(precision, "cpu_supports_bf16", lambda native=native: native)
        assert trainer_bf16(_args(), "cpu") is native
    assert capsys.readouterr().err == ""  # "auto" is never warned about


def test_explicit_bf16_on_a_cpu_without_it_is_obeyed_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: False)
    assert trainer_bf16(_args("trainer.args.bf16=true"), "cpu") is True
    err = capsys.readouterr().err
    assert "trainer.args.bf16 = true" in err and "~100x slower" in err and '"auto"' in err
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: True)
    assert trainer_bf16(_args("trainer.args.bf16=true"), "cpu") is True
    assert capsys.readouterr().err == ""


def test_server_warns_of_an_explicit_bf16_dtype_on_a_cpu_without_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger="vfkit.serve"):
        assert choose_dtype("bfloat16", "cpu") == torch.bfloat16
    assert "--dtype bfloat16" in caplog.text and "~100x slower" in caplog.text


def test_the_plan_says_what_auto_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(REPO / "configs" / "exp.toml", ["trainer.gpus=0", "inference.gpus=0"])
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: False)
    assert plan_precision(cfg, "builtin") == (
        'trainer fp32 (bf16 "auto": this CPU has no bf16 units); server fp32 (dtype auto)')
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: True)
    assert plan_precision(cfg, "builtin") == (
        'trainer bf16 autocast (bf16 "auto": this CPU has bf16 units); server bf16 (dtype auto)')
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: False)
    forced = load_config(REPO / "configs" / "exp.toml", ["trainer.gpus=0", "inference.gpus=0",
                                                         "trainer.args.bf16=true"])
    assert "trainer bf16 autocast (trainer.args.bf16 = true, but this CPU has no native bf16"\
        in plan_precision(forced, "builtin")
