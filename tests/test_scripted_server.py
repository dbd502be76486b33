"""The test server answers like vLLM: token ids, logprobs, tool calls, errors, LoRA routes."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from vfkit.testing.scripted_server import Reply, TestServer
from vfkit.testing.tiny_model import make_tokenizer

IDS = {"return_token_ids": True}


def client_for(server: TestServer, **kw) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.base_url, api_key=kw.pop("api_key", "x"), **kw)


async def test_chat_returns_vllm_token_fields():
    tok = make_tokenizer()
    messages = [{"role": "user", "content": "hi"}]
    with TestServer(["hello"], logprob=-0.25) as srv:
        resp = await client_for(srv).chat.completions.create(
            model="m", messages=messages, logprobs=True, extra_body=IDS
        )
    data = resp.model_dump()
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert data["prompt_token_ids"] == tok.encode(prompt, add_special_tokens=False)
    choice = data["choices"][0]
    # 5 bytes of "hello" plus the eos id the template's <|im_end|> uses
    assert choice["token_ids"] == [*tok.encode("hello"), tok.eos_token_id]
    assert choice["message"]["content"] == "hello"
    assert choice["finish_reason"] == "stop"
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == [-0.25] * 6
    assert data["usage"]["completion_tokens"] == 6
    assert srv.requests[0]["messages"] == messages


async def test_max_tokens_truncates_and_reports_length():
    with TestServer("abcdefgh") as srv:
        resp = await client_for(srv).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=3,
            logprobs=True, extra_body=IDS,
        )
    choice = resp.model_dump()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == "abc"
    assert len(choice["token_ids"]) == 3 and len(choice["logprobs"]["content"]) == 3


async def test_no_token_ids_unless_asked():
    with TestServer("ok") as srv:
        resp = await client_for(srv).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    data = resp.model_dump()
    assert data.get("prompt_token_ids") is None and data["choices"][0].get("token_ids") is None


async def test_tool_calls_from_text_and_verbatim():
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    script = [
        'Adding.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
        Reply(tool_calls=[{"name": "add", "arguments": "{not json"}]),
    ]
    with TestServer(script) as srv:
        client = client_for(srv)
        msgs = [{"role": "user", "content": "1+2"}]
        first = await client.chat.completions.create(
            model="m", messages=msgs, tools=tools, extra_body=IDS
        )
        second = await client.chat.completions.create(model="m", messages=msgs, tools=tools)
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].message.content == "Adding."
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 1, "b": 2}
    assert first.choices[0].finish_reason == "tool_calls"
    assert second.choices[0].message.tool_calls[0].function.arguments == "{not json"
    # the tools reached the template: the prompt shows the tool schema
    assert '"name": "add"' in make_tokenizer().decode(first.model_extra["prompt_token_ids"])
    assert srv.requests[0]["tools"] == tools


async def test_completions_endpoint():
    tok = make_tokenizer()
    with TestServer(lambda body: body["prompt"][::-1]) as srv:
        resp = await client_for(srv).completions.create(
            model="m", prompt="abc", logprobs=1, extra_body=IDS
        )
    choice = resp.model_dump()["choices"][0]
    assert choice["text"] == "cba"
    assert choice["prompt_token_ids"] == tok.encode("abc")
    assert choice["token_ids"] == [*tok.encode("cba"), tok.eos_token_id]
    assert choice["logprobs"]["token_logprobs"] == [-0.5] * 4


async def test_retry_after_429_then_success():
    with TestServer("fine") as srv:
        srv.fail_next(429, retry_after=0.01)
        srv.fail_next(500)
        resp = await client_for(srv, max_retries=3).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert resp.choices[0].message.content == "fine"
    assert len(srv.requests) == 3


async def test_failure_without_retries_raises_rate_limit():
    with TestServer("fine") as srv:
        srv.fail_next(429, message="queue full")
        with pytest.raises(openai.RateLimitError, match="queue full"):
            await client_for(srv, max_retries=0).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )


async def test_delay_causes_client_timeout():
    with TestServer("late") as srv:
        srv.delay_next(1.0)
        with pytest.raises(openai.APITimeoutError):
            await client_for(srv, max_retries=0, timeout=0.2).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )


async def test_context_overflow_is_a_400_with_vllm_message():
    with TestServer("x", max_context=20) as srv:
        client = client_for(srv, max_retries=0)
        with pytest.raises(openai.BadRequestError, match="maximum context length is 20 tokens"):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "y" * 30}]
            )
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "y"}], max_tokens=15
            )


async def test_script_exhausted_is_a_400():
    with TestServer(["only"]) as srv:
        client = client_for(srv, max_retries=0)
        msgs = [{"role": "user", "content": "x"}]
        await client.chat.completions.create(model="m", messages=msgs)
        with pytest.raises(openai.BadRequestError, match="script exhausted"):
            await client.chat.completions.create(model="m", messages=msgs)


def test_lora_routes_and_models(tmp_path):
    with TestServer(api_key="k") as srv:
        root = srv.base_url.removesuffix("/v1")
        h = {"Authorization": "Bearer k"}
        assert httpx.get(f"{root}/health", headers=h).status_code == 200
        assert httpx.get(f"{root}/health").status_code == 401  # as vf-serve: every route
        assert httpx.get(f"{srv.base_url}/models").status_code == 401
        load = {"lora_name": "step_1", "lora_path": str(tmp_path)}
        assert httpx.post(f"{srv.base_url}/load_lora_adapter", json=load, headers=h).is_success
        again = httpx.post(f"{srv.base_url}/load_lora_adapter", json=load, headers=h)
        assert again.status_code == 400
        inplace = {**load, "load_inplace": True}
        assert httpx.post(f"{srv.base_url}/load_lora_adapter", json=inplace, headers=h).is_success
        missing = {"lora_name": "x", "lora_path": str(tmp_path / "nope")}
        bad = httpx.post(f"{srv.base_url}/load_lora_adapter", json=missing, headers=h)
        assert bad.status_code == 404
        ids = [m["id"] for m in httpx.get(f"{srv.base_url}/models", headers=h).json()["data"]]
        assert ids == ["test-model", "step_1"]
        gone = {"lora_name": "step_1"}
        assert httpx.post(f"{srv.base_url}/unload_lora_adapter", json=gone, headers=h).is_success
        twice = httpx.post(f"{srv.base_url}/unload_lora_adapter", json=gone, headers=h)
        assert twice.status_code == 404
    assert [kind for kind, _ in srv.lora_requests] == ["load"] * 4 + ["unload"] * 2
    assert srv.adapters == {}


def test_lora_load_reports_the_adapter_fingerprint(tmp_path):
    from safetensors.torch import save_file

    from vfkit.lora_fingerprint import fingerprint_dir

    save_file({"w": __import__("torch").ones(2)}, str(tmp_path / "adapter_model.safetensors"))
    with TestServer("x") as srv:
        load = {"lora_name": "a.b", "lora_path": str(tmp_path)}
        r = httpx.post(f"{srv.base_url}/load_lora_adapter", json=load)
        assert r.json()["fingerprint"] == fingerprint_dir(tmp_path)
        cards = httpx.get(f"{srv.base_url}/models").json()["data"]
        assert cards[1]["fingerprint"] == fingerprint_dir(tmp_path)


async def test_streamed_chat_with_tool_calls():
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    text = 'Adding.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    with TestServer([text]) as srv:
        stream = await client_for(srv).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "1+2"}], tools=tools, stream=True,
            logprobs=True, stream_options={"include_usage": True}, extra_body=IDS,
        )  # fmt: skip
        chunks = [c async for c in stream]
    choices = [c.choices[0] for c in chunks if c.choices]
    assert "".join(c.delta.content or "" for c in choices) == "Adding."
    calls = [call for c in choices for call in c.delta.tool_calls or []]
    assert [(c.index, c.function.name) for c in calls] == [(0, "add")]
    assert json.loads(calls[0].function.arguments) == {"a": 1, "b": 2}
    assert choices[-1].finish_reason == "tool_calls"
    ids = [t for c in choices for t in c.model_extra["token_ids"]]
    assert make_tokenizer().decode(ids, skip_special_tokens=True) == text
    assert chunks[-1].usage.completion_tokens == len(ids)


async def test_streamed_text_completion_in_chunks():
    with TestServer("streamed words") as srv:
        stream = await client_for(srv).completions.create(
            model="m", prompt="say", stream=True, max_tokens=8, extra_body=IDS
        )
        chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks) == "streamed"
    assert len(chunks) == 8 and chunks[-1].choices[0].finish_reason == "length"


async def test_requests_are_validated_by_the_real_server():
    """One protocol: the scripted server refuses what vf-serve refuses, in the same words."""
    with TestServer("x") as srv:
        client = client_for(srv, max_retries=0)
        msgs = [{"role": "user", "content": "x"}]
        for bad in ({"temperature": -1}, {"n": 0}, {"best_of": 3}, {"chat_template": "{{ 1 }}"}):
            with pytest.raises(openai.BadRequestError):
                await client.chat.completions.create(model="m", messages=msgs, extra_body=bad)
    assert len(srv.requests) == 4  # recorded all the same


def test_an_unload_that_fails_after_its_answer_is_logged(tmp_path, monkeypatch, caplog) -> None:
    """The unload route answers before the engine frees the adapter (once no sequence uses it);
    an error freeing it went nowhere. Now it reaches the server log."""
    import httpx

    with TestServer("ok") as srv:
        httpx.post(srv.base_url + "/load_lora_adapter",
                   json={"lora_name": "a", "lora_path": str(tmp_path)}).raise_for_status()

        def broken(name: str) -> None:
            raise RuntimeError(f"cannot free {name}")

        monkeypatch.setattr(srv.engine.lora, "apply_unload", broken)
        with caplog.at_level("ERROR", logger="vfkit.serve.app"):
            answer = httpx.post(srv.base_url + "/unload_lora_adapter", json={"lora_name": "a"})
            deadline = time.monotonic() + 10
            while "freeing adapter 'a' failed" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.02)
    assert answer.status_code == 200
    assert "freeing adapter 'a' failed" in caplog.text and "cannot free a" in caplog.text
