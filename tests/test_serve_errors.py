"""The embedded server's refusals: 400/404 bodies, API keys, 429 under overload, dropped clients."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from vfkit.serve.config import ServeConfig
from vfkit.serve.runner import BackgroundServer

LONG = {"max_tokens": 400, "ignore_eos": True}  # keeps a row busy for a while


@pytest.fixture(scope="module")
def server(tiny_model_path):
    config = ServeConfig(str(tiny_model_path), served_model_name="tiny", dtype="float32", threads=1)
    with BackgroundServer(config) as srv:
        yield srv


def post(server, route, body=None, content=None, timeout=30.0):
    headers = {"Content-Type": "application/json"}
    url = server.base_url + route
    return httpx.post(url, json=body, content=content, headers=headers, timeout=timeout)


def assert_error(resp, status, *words):
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"]


def test_malformed_requests_get_400(server):
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    assert_error(post(server, "/chat/completions", content=b"{not json"), 400, "JSON")
    assert_error(post(server, "/chat/completions", {"model": "tiny"}), 400, "messages")
    assert_error(post(server, "/chat/completions", {**chat, "top_p": 0}), 400, "top_p")
    assert_error(post(server, "/chat/completions", {**chat, "n": 0}), 400, "n")
    assert_error(post(server, "/chat/completions", {**chat, "temperature": -1}), 400)
    assert_error(post(server, "/chat/completions", {**chat, "messages": [{"x": 1}]}), 400, "role")
    assert_error(post(server, "/completions", {"model": "tiny", "prompt": [99999]}), 400, "token")
    assert_error(post(server, "/completions", {"model": "tiny", "prompt": []}), 400)
    assert_error(post(server, "/load_lora_adapter", {"lora_name": "x"}), 400, "lora_path")


def test_unknown_model_and_route_get_404(server):
    body = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
    assert_error(post(server, "/chat/completions", body), 404, "`nope` does not exist")
    assert_error(httpx.get(server.base_url + "/no/such/route"), 404)


def test_prompt_longer_than_context_is_a_400_the_client_recognises(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 1024 tokens"):
        client.completions.create(model="tiny", prompt="y" * 1100, max_tokens=5)
    # fits alone, but not with the requested completion
    with pytest.raises(openai.BadRequestError, match="1000 in the messages, 100 in the completion"):
        client.completions.create(model="tiny", prompt="y" * 1000, max_tokens=100)
    ok = client.completions.create(model="tiny", prompt="y" * 1000, max_tokens=24)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_api_key_guards_every_route(tiny_model_path):
    config = ServeConfig(str(tiny_model_path), dtype="float32", threads=1, api_key="sekrit")
    with BackgroundServer(config) as srv:
        root = srv.base_url[: -len("/v1")]
        assert_error(httpx.get(root + "/health"), 401, "API key")
        assert_error(httpx.get(srv.base_url + "/models"), 401)
        wrong = {"Authorization": "Bearer nope"}
        assert_error(httpx.post(srv.base_url + "/completions", json={}, headers=wrong), 401)
        good = {"Authorization": "Bearer sekrit"}
        assert httpx.get(root + "/health", headers=good).status_code == 200
        client = openai.OpenAI(base_url=srv.base_url, api_key="sekrit", max_retries=0)
        r = client.completions.create(model=str(tiny_model_path), prompt="a", max_tokens=2)
        assert r.usage.completion_tokens >= 1
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.base_url, api_key="bad", max_retries=0).models.list()


async def test_overload_gets_429_with_retry_after_then_succeeds_on_retry(tiny_model_path):
    config = ServeConfig(
        str(tiny_model_path), dtype="float32", threads=1, max_num_seqs=1, max_queue=1
    )
    with BackgroundServer(config) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as http:
            body = {"prompt": "a", "max_tokens": 60, "ignore_eos": True}
            first = asyncio.create_task(http.post("/completions", json=body))
            health = srv.base_url.removesuffix("/v1") + "/health"
            while (await http.get(health)).json()["running"] < 1:  # the one row is taken
                await asyncio.sleep(0.02)
            rest = await asyncio.gather(*(http.post("/completions", json=body) for _ in range(5)))
            replies = [await first, *rest]
        statuses = sorted(r.status_code for r in replies)
        assert statuses.count(200) >= 2 and 429 in statuses  # one running + one queued at least
        refused = next(r for r in replies if r.status_code == 429)
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        # the openai client honours Retry-After and retries until served
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=8)
        done = await asyncio.gather(
            *(
                client.completions.create(model=config.model, prompt="b", max_tokens=20)
                for _ in range(4)
            )
        )
        assert all(r.usage.completion_tokens >= 1 for r in done)


def test_dropped_client_frees_its_row(tiny_model_path):
    config = ServeConfig(str(tiny_model_path), dtype="float32", threads=1, max_model_len=30000)
    with BackgroundServer(config) as srv:
        root = srv.base_url[: -len("/v1")]
        body = {"prompt": "a", "max_tokens": 25000, "ignore_eos": True}
        with pytest.raises(httpx.ReadTimeout):
            post(srv, "/completions", body, timeout=0.5)  # the client gives up
        deadline = time.monotonic() + 10
        while httpx.get(root + "/health").json()["running"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert httpx.get(root + "/health").json() == {"status": "ok", "waiting": 0, "running": 0}
        assert srv.engine.steps < 25000  # aborted, not run to the end


def test_a_failing_step_fails_its_requests_and_the_server_goes_on(tiny_model_path):
    config = ServeConfig(str(tiny_model_path), dtype="float32", threads=1)
    with BackgroundServer(config) as srv:
        real_forward = srv.engine.lora.forward
        calls = []

        def forward_once_broken(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("boom")
            return real_forward(*args, **kwargs)

        srv.engine.lora.forward = forward_once_broken
        body = {"prompt": "a", "max_tokens": 3}
        assert_error(post(srv, "/completions", body), 500, "boom")
        assert post(srv, "/completions", body).status_code == 200


def test_a_dead_worker_answers_503_instead_of_hanging(tiny_model_path):
    config = ServeConfig(str(tiny_model_path), dtype="float32", threads=1)
    with BackgroundServer(config) as srv:

        def die():
            raise SystemExit("worker killed")  # not an Exception: ends the worker thread

        srv.engine.lora.forward = lambda *a, **k: die()
        start = time.monotonic()
        assert_error(post(srv, "/completions", {"prompt": "a", "max_tokens": 3}), 500, "killed")
        assert time.monotonic() - start < 10
        root = srv.base_url[: -len("/v1")]
        assert_error(httpx.get(root + "/health"), 503, "not running")
        assert_error(post(srv, "/completions", {"prompt": "a", "max_tokens": 3}), 503)
