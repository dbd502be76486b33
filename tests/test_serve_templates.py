"""Client-supplied chat templates: refused by default, sandboxed and time-bounded when trusted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from vfkit.serve.config import ServeConfig
from vfkit.serve.prompts import TEMPLATE_BUDGET_S
from vfkit.serve.runner import BackgroundServer
from vfkit.testing.tiny_model import make_tokenizer

# 10^10 loop iterations: hours of CPU if nothing bounds it
HOSTILE = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
FRIENDLY = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(base_url: str, timeout: float = 30.0, **extra) -> httpx.Response:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2, **extra}
    return httpx.post(f"{base_url}/chat/completions", json=body, timeout=timeout)


@pytest.fixture(scope="module")
def server(tiny_model_path):
    config = ServeConfig(str(tiny_model_path), served_model_name="tiny", dtype="float32", threads=1)
    with BackgroundServer(config) as srv:
        yield srv


@pytest.mark.parametrize(
    "extra",
    [{"chat_template": FRIENDLY}, {"chat_template_kwargs": {"chat_template": FRIENDLY}}],
    ids=["top-level", "in-kwargs"],
)
def test_request_templates_are_refused_by_default(server, extra):
    r = chat(server.base_url, **extra)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "chat_template"
    assert "--trust-request-chat-template" in error["message"]


def test_other_template_kwargs_still_reach_the_template(server):
    r = chat(server.base_url, chat_template_kwargs={"enable_thinking": False})
    assert r.status_code == 200, r.text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def trusting_process(tiny_model_path):
    """A real vf-serve process that renders request templates (SIGTERM is tested on it)."""
    port = _free_port()
    cmd = [
        sys.executable, "-m", "vfkit.cli.serve", str(tiny_model_path),
        "--served-model-name", "tiny", "--port", str(port), "--dtype", "float32",
        "--threads", "1", "--trust-request-chat-template", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env={**os.environ}, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    yield proc, base + "/v1", base + "/health"
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def _timed_health(url: str) -> float:
    t0 = time.monotonic()
    assert httpx.get(url, timeout=TEMPLATE_BUDGET_S * 2).status_code == 200
    return time.monotonic() - t0


def test_a_hostile_trusted_template_is_bounded_and_the_server_stays_up(trusting_process):
    proc, base_url, health = trusting_process
    # a trusted template that behaves renders as asked
    r = chat(base_url, chat_template=FRIENDLY, return_token_ids=True)
    assert r.status_code == 200, r.text
    assert make_tokenizer().decode(r.json()["prompt_token_ids"]) == "<user>hi<assistant>"

    # /health must answer at once while the template renders: blocked, it would wait out the
    # whole TEMPLATE_BUDGET_S. "At once" is relative to this machine's idle answer (a loaded CI
    # machine is slow at everything), capped below the budget so a blocked server still fails
    idle = min(_timed_health(health) for _ in range(3))
    limit = min(TEMPLATE_BUDGET_S * 0.75, max(1.0, 5 * idle))
    answers: list[httpx.Response] = []
    started = time.monotonic()
    worker = threading.Thread(target=lambda: answers.append(chat(base_url, chat_template=HOSTILE)))
    worker.start()
    time.sleep(0.3)  # the template is rendering now
    while worker.is_alive():
        assert _timed_health(health) < limit
        time.sleep(0.2)
    worker.join()
    assert time.monotonic() - started < TEMPLATE_BUDGET_S + 10
    assert answers[0].status_code == 400, answers[0].text
    assert answers[0].json()["error"]["param"] == "chat_template"

    # SIGTERM while another hostile template renders: the process still stops
    threading.Thread(target=lambda: chat(base_url, timeout=60, chat_template=HOSTILE)).start()
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) is not None
