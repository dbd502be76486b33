"""The trainer rides out a server that restarts: sync retries, lost adapters re-load, eval files."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
import uvicorn
from safetensors.torch import save_file

from vfkit.errors import AdapterSyncError
from vfkit.testing.scripted_server import TestServer
from vfkit.testing.tiny_model import make_tokenizer
from vfkit.train.adapter_sync import AdapterSync
from vfkit.train.orchestrator import Orchestrator
from vfkit.train.phases import load_data, train
from vfkit.train.rundir import RunDir

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _train_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))


def adapter_dir(tmp_path: Path, step: int = 1) -> Path:
    path = tmp_path / "adapters" / f"step_{step}"
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    save_file({"w": torch.zeros(2)}, str(path / "adapter_model.safetensors"))
    return path


def serve_later(app: object, port: int, delay: float) -> tuple[uvicorn.Server, threading.Thread]:
    """Serve `app` on 127.0.0.1:`port` after `delay` s: a server coming back from a restart."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off", timeout_graceful_shutdown=1))

    def run() -> None:
        time.sleep(delay)
        server.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return server, thread


def test_load_waits_for_a_server_that_restarts_on_the_same_port(tmp_path, caplog) -> None:
    path = adapter_dir(tmp_path)
    with TestServer("x") as first:
        url, port = first.base_url, first.port
    second = TestServer("x")  # the restarted server: same port, no adapters yet
    server, thread = serve_later(second.app, port, delay=1.0)
    try:
        async def go() -> None:
            sync = AdapterSync(url, timeout=10)
            await sync.load("run-step1", path)
            await sync.aclose()

        with caplog.at_level(logging.WARNING, logger="vfkit.train.adapter_sync"):
            asyncio.run(go())
    finally:
        server.should_exit = True
        thread.join(timeout=5)
    assert second.adapters == {"run-step1": str(path.resolve())}
    assert "unreachable" in caplog.text and "retrying (1/" in caplog.text


def test_unreachable_server_gives_up_after_the_sync_timeout(caplog) -> None:
    sync = AdapterSync("http://127.0.0.1:9/v1", timeout=1.6)
    started = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger="vfkit.train.adapter_sync"),
        pytest.raises(AdapterSyncError) as err,
    ):
        asyncio.run(sync.load("a", Path("/tmp")))
    assert 1.0 < time.monotonic() - started < 5
    message = str(err.value)
    assert "http://127.0.0.1:9/v1/load_lora_adapter" in message
    assert "is the server running" in message and "sync_timeout" in message
    assert "retrying (1/2)" in caplog.text and "retrying (2/2)" in caplog.text


def test_probe_retries_5xx_answers() -> None:
    with TestServer("hello") as srv:
        srv.fail_next(503, n=2)
        probe = asyncio.run(AdapterSync(srv.base_url, timeout=5).probe("base", max_tokens=3))
        assert len(srv.requests) == 3  # two 503s, then the answer
    assert len(probe.completion_ids) == 3


def lose_adapter(srv: TestServer, name: str) -> None:
    """What a restart does to a served adapter: gone, and the next request for it is a 404."""
    response = httpx.post(f"{srv.base_url}/unload_lora_adapter", json={"lora_name": name})
    assert response.status_code == 200 and name not in srv.adapters
    srv.fail_next(404, message=f"The model `{name}` does not exist.")


def test_probe_reloads_a_lost_adapter(tmp_path) -> None:
    path = adapter_dir(tmp_path)
    with TestServer("hello") as srv:
        async def go() -> None:
            sync = AdapterSync(srv.base_url, timeout=5)
            await sync.load("run-step1", path)
            lose_adapter(srv, "run-step1")
            probe = await sync.probe("run-step1", max_tokens=2)
            assert len(probe.logprobs) == 2
            await sync.aclose()

        asyncio.run(go())
        loads = [body["lora_name"] for kind, body in srv.lora_requests if kind == "load"]
        assert loads == ["run-step1", "run-step1"] and "run-step1" in srv.adapters


def test_generation_reloads_a_lost_adapter_and_keeps_its_rollouts(
    tiny_model_path, tmp_path
) -> None:
    import train_testing

    with TestServer(train_testing.GroupResponder()) as srv:
        cfg = train_testing.tiny_config(tiny_model_path, tmp_path, srv.base_url,
                                        "trainer.args.max_concurrent=4")
        env, rows, _, _ = load_data(cfg, make_tokenizer())
        path = adapter_dir(tmp_path / cfg.run_name)
        run = RunDir(tmp_path / cfg.run_name)
        with Orchestrator(env, rows, base_url=srv.base_url, args=cfg.trainer.args,
                          run=run) as orch:
            orch.publish(1, path, learner=None)
            name = run.adapter_name(1)
            lose_adapter(srv, name)
            orch.submit(3)  # async_level 1: batch 3 is sampled by policy 1
            batch = orch.get(3)
        loads = [body for kind, body in srv.lora_requests if kind == "load"]
    assert name == f"{cfg.run_name}-step1"
    assert [b["lora_name"] for b in loads] == [name, name]
    assert loads[1]["lora_path"] == str(path.resolve())  # from adapters/step_1
    states = [s for group in batch.groups for s in group]
    assert len(states) == 8 and not [s["error"] for s in states if s.get("error")]


def test_eval_rollouts_are_saved_like_training_rollouts(tiny_model_path, tmp_path) -> None:
    import train_testing

    with TestServer(train_testing.GroupResponder()) as srv:
        cfg = train_testing.tiny_config(
            tiny_model_path, tmp_path, srv.base_url, "trainer.args.max_steps=2",
            "trainer.args.eval_steps=2", "trainer.args.eval_num_examples=3",
        )
        run_dir = train(cfg)
    rollouts = run_dir / "rollouts"
    assert sorted(p.name for p in rollouts.glob("eval_*")) == [
        "eval_step_0.jsonl", "eval_step_2.jsonl"]
    train_row = json.loads((rollouts / "step_1.jsonl").read_text().splitlines()[0])
    evals = [json.loads(line) for line in (rollouts / "eval_step_2.jsonl").read_text().splitlines()]
    assert len(evals) == 3 and all(set(r) == set(train_row) for r in evals)
    assert [r["policy_version"] for r in evals] == [2, 2, 2]
    assert [r["group"] for r in evals] == [0, 1, 2]
    assert all(r["reward"] is not None and r["trajectory"][0]["tokens"] for r in evals)


def test_eval_rollouts_ride_out_a_server_blip_as_training_rollouts_do(
    tiny_model_path, tmp_path
) -> None:
    """Eval rollouts had only the environment's 3 retries: 8 overloaded answers made the held-out
    reward an error where a training batch would have waited them out."""
    import train_testing

    with TestServer(train_testing.GroupResponder()) as srv:
        cfg = train_testing.tiny_config(tiny_model_path, tmp_path, srv.base_url,
                                        "trainer.args.eval_steps=2",
                                        "trainer.args.eval_num_examples=1")
        env, rows, eval_env, eval_rows = load_data(cfg, make_tokenizer())
        run = RunDir(tmp_path / cfg.run_name)
        with Orchestrator(env, rows, base_url=srv.base_url, args=cfg.trainer.args, run=run,
                          eval_env=eval_env, eval_rows=eval_rows[:1]) as orch:
            srv.fail_next(503, n=8, retry_after=0.01)
            metrics = orch.evaluate(0)
            asked = len(srv.requests)
    assert asked == 9 and metrics["eval/errors"] == 0


class DeadServer:
    """A started server process that has already exited (what KeptServer watches)."""

    base_url, returncode, log_path = "http://127.0.0.1:9/v1", -9, "logs/server.log"

    def alive(self) -> bool:
        return False

    def stop(self) -> None:
        pass


def test_a_server_that_cannot_be_kept_stops_the_run_at_once(tiny_model_path, tmp_path) -> None:
    """When vf-train's own server could not be restarted, the keeper only printed a line and
    every rollout then retried for sync_timeout; now the batch wait ends with the reason."""
    from vfkit.errors import ServerError, VfkitError
    from vfkit.serve.launcher import KeptServer

    def start(port):
        if port is not None:  # a restart
            raise ServerError("port 9 is taken")
        return DeadServer()

    def gave_up(kept: KeptServer) -> str | None:
        deadline = time.monotonic() + 10
        while kept.failure is None and time.monotonic() < deadline:
            time.sleep(0.01)
        kept.stop()
        return kept.failure

    assert gave_up(KeptServer(lambda port: DeadServer(), max_restarts=1, poll_s=0.01)) == (
        "the inference server exited again (code -9) after 1 restarts; see its log: "
        "logs/server.log")
    kept = KeptServer(start, max_restarts=1, poll_s=0.01)
    assert gave_up(kept) == "restarting the inference server failed: port 9 is taken"

    import train_testing

    with TestServer(train_testing.GroupResponder()) as srv:
        srv.delay_next(30, n=8)  # the batch would take long: the failure must not wait for it
        cfg = train_testing.tiny_config(tiny_model_path, tmp_path, srv.base_url)
        env, rows, _, _ = load_data(cfg, make_tokenizer())
        with Orchestrator(env, rows, base_url=srv.base_url, args=cfg.trainer.args,
                          run=RunDir(tmp_path / cfg.run_name),
                          server_failure=lambda: kept.failure) as orch:
            orch.submit(1)
            with pytest.raises(VfkitError, match="port 9 is taken; the run stops here"):
                orch.get(1)
