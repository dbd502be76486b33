"""Adapter hot-loading over HTTP: load + listed check, probe, unload, and clear failures."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from vfkit.errors import AdapterSyncError
from vfkit.testing.scripted_server import TestServer
from vfkit.train.adapter_sync import AdapterSync, Probe, check_probe


def run(coro):
    return asyncio.run(coro)


def adapter_dir(tmp_path: Path) -> Path:
    path = tmp_path / "adapters" / "step_1"
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    return path


def test_load_probe_unload(tmp_path: Path) -> None:
    path = adapter_dir(tmp_path)
    with TestServer("hello", logprob=-1.25) as srv:
        async def go() -> Probe:
            sync = AdapterSync(srv.base_url, timeout=5)
            await sync.load("run-step1", path)
            probe = await sync.probe("run-step1", max_tokens=3)
            await sync.unload("run-step1")
            await sync.unload("never-loaded")  # 404 is fine: nothing to unload
            await sync.aclose()
            return probe

        probe = run(go())
        kinds = [(kind, body["lora_name"]) for kind, body in srv.lora_requests]
        assert kinds == [("load", "run-step1"), ("unload", "run-step1"),
                         ("unload", "never-loaded")]
        assert srv.requests[-1]["model"] == "run-step1" and srv.requests[-1]["temperature"] == 1.0
    assert probe.completion_ids and len(probe.logprobs) == len(probe.completion_ids) == 3
    assert probe.logprobs == [-1.25] * 3 and probe.prompt_ids


def test_refused_load_names_adapter_and_path(tmp_path: Path) -> None:
    missing = tmp_path / "adapters" / "step_9"
    with TestServer("x") as srv:
        sync = AdapterSync(srv.base_url, timeout=5)
        with pytest.raises(AdapterSyncError, match=r"refused adapter run-step9 from .*: HTTP"):
            run(sync.load("run-step9", missing))


def test_unreachable_server() -> None:
    sync = AdapterSync("http://127.0.0.1:9/v1", timeout=2)
    with pytest.raises(AdapterSyncError, match=r"could not reach .* is the server running"):
        run(sync.load("a", Path("/tmp")))


def test_check_probe_tolerance() -> None:
    probe = Probe([1, 2], [3, 4], [-1.0, -2.0])
    # median of |(-1) - (-1.1)| and |(-2) - (-2.1)| = 0.1
    assert check_probe("a", probe, [-1.1, -2.1], tolerance=0.2) == pytest.approx(0.1)
    with pytest.raises(AdapterSyncError, match=r"differ by 0\.1000 \(median .*tolerance 0\.05\)"):
        check_probe("a", probe, [-1.1, -2.1], tolerance=0.05)
