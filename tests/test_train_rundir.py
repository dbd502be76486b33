"""Run directory and the inference-server wiring (backend, GPUs, CPU thread split)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vfkit.errors import VfkitError
from vfkit.train.config_loader import parse_config
from vfkit.train.placement import choose_backend, cpu_threads, launcher_kwargs
from vfkit.train.rundir import RunDir, dump_toml, open_run_dir, step_of

BASE = 'model = "m"\n[env]\nid = "e"\n'


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = parse_config(BASE, overrides=[f'trainer.args.output_dir="{tmp_path}"',
                                        'inference.api_key="secret"', "env.args.n=2",
                                        "trainer.args.adapter_probe_tolerance=inf"])
    run_dir = open_run_dir(cfg, resume=False)
    text = run_dir.config.read_text()
    assert "secret" not in text
    again = parse_config(text)
    assert again.args == cfg.args and again.env == cfg.env


def test_fresh_run_refuses_to_overwrite_checkpoints(tmp_path: Path) -> None:
    cfg = parse_config(BASE, overrides=[f'trainer.args.output_dir="{tmp_path}"'])
    run_dir = open_run_dir(cfg, resume=False)
    run_dir.checkpoint_dir(1).mkdir()
    (run_dir.checkpoint_dir(1) / "state.json").write_text("{}")
    with pytest.raises(VfkitError, match="--resume"):
        open_run_dir(cfg, resume=False)
    assert open_run_dir(cfg, resume=True) == run_dir


def test_dump_toml_nested_tables() -> None:
    assert dump_toml({"a": 1, "t": {"b": [1, 2], "u": {"c": "x"}}}) == (
        'a = 1\n\n[t]\nb = [1, 2]\n\n[t.u]\nc = "x"\n')


def test_backend_and_threads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    import torch

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only machine
    cfg = parse_config(BASE)
    assert choose_backend(cfg) == "builtin"
    assert cpu_threads(cfg) == (4, 4)
    assert launcher_kwargs(cfg, RunDir(tmp_path))["extra_args"] == ["--threads", "4"]
    remote = parse_config(BASE, overrides=['inference.base_url="http://10.1.2.3:8000/v1"'])
    assert cpu_threads(remote) is None  # the server has its own machine
    assert launcher_kwargs(cfg, RunDir(tmp_path))["allowed_adapter_dirs"] == [
        str((tmp_path).resolve())]
    vllm = parse_config(BASE, overrides=['inference.backend="vllm"',
                                         'inference.base_url="http://h:1/v1"'])
    assert launcher_kwargs(vllm, RunDir(tmp_path))["extra_args"] == [
        "--logprobs-mode", "processed_logprobs"]  # sampled-distribution logprobs, as the loss needs


def test_adapter_names_round_trip_through_the_run_dir(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "exp.v2")  # a '.' in the run name stays part of the name
    assert run.adapter_name(12) == "exp.v2-step12"
    assert run.version_of(run.adapter_name(12)) == 12
    assert run.version_of("other-run-step3") is None
    assert run.version_of("exp.v2-stepX") is None
    assert run.adapter_dir(12) == tmp_path / "exp.v2" / "adapters" / "step_12"
    assert step_of(run.adapter_dir(12)) == 12 and step_of(run.eval_rollouts_file(3)) is None
