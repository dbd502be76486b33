"""start_server / ServerProcess: real child processes, health, keys, clean stops, no orphans."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from vfkit.errors import ServerError
from vfkit.serve.launcher import start_server
from vfkit.serve.vllm import vllm_command, vllm_env, vllm_python


def gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie counts as exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:\tZ") for line in f)
    except FileNotFoundError:
        return True


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return gone(pid)


def test_builtin_server_lifecycle(tiny_model_path, tmp_path):
    log = tmp_path / "logs" / "server.log"
    server = start_server(
        str(tiny_model_path), api_key="k3y", log_path=log, dtype="float32",
        allowed_adapter_dirs=[tmp_path], extra_args=["--threads", "1"], health_timeout=120,
    )  # fmt: skip
    with server:
        assert server.alive() and server.base_url.startswith("http://127.0.0.1:")
        client = openai.OpenAI(base_url=server.base_url, api_key="k3y", max_retries=0)
        r = client.completions.create(model=str(tiny_model_path), prompt="hi", max_tokens=3)
        assert r.usage.completion_tokens >= 1
        assert httpx.get(server.base_url + "/models").status_code == 401
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_text()
        assert "k3y" not in cmdline  # the key travels in the environment, not in argv
    assert not server.alive()
    assert wait_gone(server.pid, 5)
    with pytest.raises(ProcessLookupError):
        os.killpg(server.pid, 0)  # the whole process group is gone
    text = log.read_text()
    assert "-m vfkit.cli.serve" in text and "--allowed-adapter-dir" in text
    assert server.stop() == server.popen.returncode  # a second stop is harmless


def test_a_server_that_cannot_start_fails_fast_with_its_log(tmp_path):
    start = time.monotonic()
    with pytest.raises(ServerError, match=r"exited with code .*Last lines"):
        start_server(str(tmp_path / "no-such-model"), log_path=tmp_path / "s.log")
    assert time.monotonic() - start < 60


def test_unknown_backend_is_refused():
    with pytest.raises(ServerError, match="Unknown server backend 'tgi'"):
        start_server("m", backend="tgi")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_missing_vllm_says_how_to_install(monkeypatch):
    monkeypatch.delenv("VFKIT_VLLM_PYTHON", raising=False)
    with pytest.raises(ServerError, match=r"pip install 'vfkit\[vllm\]'.*base_url"):
        vllm_python()


def test_vllm_command_and_env():
    cmd = vllm_command(
        "/venv/bin/python", "/models/m", served_name="org/m", host="0.0.0.0", port=8123,
        max_lora_rank=32, max_loras=2, dtype="bfloat16", data_parallel_size=2,
        tensor_parallel_size=4, extra_args=["--enforce-eager"],
    )  # fmt: skip
    line = " ".join(cmd)
    assert line.startswith(
        "/venv/bin/python -m vllm.entrypoints.openai.api_server --model /models/m"
    )
    for part in (
        "--served-model-name org/m", "--host 0.0.0.0", "--port 8123", "--dtype bfloat16",
        "--enable-lora", "--max-lora-rank 32", "--max-loras 2", "--data-parallel-size 2",
        "--tensor-parallel-size 4", "--tool-call-parser hermes",
    ):  # fmt: skip
        assert part in line
    assert cmd[-1] == "--enforce-eager"
    assert vllm_env("k") == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_API_KEY": "k"}


FAKE_VLLM = """\
#!{python}
# Stands in for vLLM's OpenAI server: records how it was started, then runs vfkit's server.
import argparse, json, os, sys
p = argparse.ArgumentParser()
for flag in ("-m", "--model", "--served-model-name", "--host", "--port", "--max-lora-rank"):
    p.add_argument(flag)
a, rest = p.parse_known_args()
json.dump({{"argv": sys.argv[1:], "env": {{k: v for k, v in os.environ.items() if "VLLM" in k}}}},
          open({record!r}, "w"))
from vfkit.cli.serve import main
sys.exit(main([a.model, "--served-model-name", a.served_model_name, "--port", a.port,
               "--api-key", os.environ.get("VLLM_API_KEY", ""), "--threads", "1"]))
"""


def test_vllm_backend_wiring_with_a_stand_in(tiny_model_path, tmp_path):
    """The vllm path end to end (flags, env, health, stop) with a script in vLLM's place."""
    import json

    record = tmp_path / "record.json"
    fake = tmp_path / "python-with-vllm"
    fake.write_text(FAKE_VLLM.format(python=sys.executable, record=str(record)))
    fake.chmod(0o755)
    with start_server(
        str(tiny_model_path), backend="vllm", executable=str(fake), api_key="vk",
        max_lora_rank=16, log_path=tmp_path / "vllm.log", health_timeout=120,
    ) as server:  # fmt: skip
        client = openai.OpenAI(base_url=server.base_url, api_key="vk", max_retries=0)
        assert [m.id for m in client.models.list().data] == [str(tiny_model_path)]
    seen = json.loads(record.read_text())
    assert seen["env"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert seen["env"]["VLLM_API_KEY"] == "vk"
    assert "--enable-lora" in seen["argv"] and "vk" not in seen["argv"]


PARENT = """\
import sys, time
from vfkit.serve.launcher import start_server
server = start_server(sys.argv[1], dtype="float32", extra_args=["--threads", "1"])
print(server.pid, flush=True)
time.sleep(600)
"""


def test_server_exits_when_its_launcher_is_killed(tiny_model_path):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tiny_model_path)], stdout=subprocess.PIPE, text=True
    )
    server_pid = int(parent.stdout.readline())
    try:
        assert not gone(server_pid)
        parent.send_signal(signal.SIGKILL)  # no atexit, no cleanup: the server must notice alone
        parent.wait()
        assert wait_gone(server_pid, 20)
    finally:
        parent.kill()
        parent.wait()
        if not gone(server_pid):
            os.killpg(server_pid, signal.SIGKILL)
