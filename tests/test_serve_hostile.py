"""Hostile and careless input to vf-serve: every mistake gets a named error, never a 500 or a hang.

Table-driven: command-line flags (refused before any model loads), HTTP request bodies
(4xx naming the field), oversized bodies (413 while /health keeps answering).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from vfkit.cli.serve import main as vf_serve
from vfkit.serve.config import ServeConfig
from vfkit.serve.runner import BackgroundServer

# ---- command-line flags: (argv after MODEL, words the error must contain) ----
BAD_FLAGS = [
    (["--max-num-seqs", "0"], ["--max-num-seqs", "[1,"]),
    (["--max-num-seqs", "-3"], ["--max-num-seqs"]),
    (["--max-num-seqs", "nan"], ["--max-num-seqs"]),
    (["--max-num-seqs", "inf"], ["--max-num-seqs"]),
    (["--max-queue", "0"], ["--max-queue"]),
    (["--max-lora-rank", "0"], ["--max-lora-rank"]),
    (["--max-loras", "-1"], ["--max-loras"]),
    (["--max-model-len", "0"], ["--max-model-len"]),
    (["--max-prefill-tokens", "0"], ["--max-prefill-tokens"]),
    (["--threads", "0"], ["--threads"]),
    (["--port", "70000"], ["--port"]),
    (["--port", "-1"], ["--port"]),
    (["--max-request-bytes", "0"], ["--max-request-bytes"]),
    (["--max-request-bytes", "1e9"], ["--max-request-bytes"]),
    (["--dtype", "fp64"], ["--dtype", "fp64"]),
    (["--device", "gpu"], ["--device", "gpu"]),
    (["--log-level", "loud"], ["--log-level"]),
    (["--served-model-name", " "], ["--served-model-name"]),
    (["--no-such-flag"], ["--no-such-flag"]),
]


@pytest.mark.parametrize(("flags", "words"), BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_bad_flags_are_named_without_a_traceback(flags, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        vf_serve(["some/model", *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "vf-serve: error:" in err
    for word in words:
        assert word in err, err


def test_a_busy_port_is_named_before_the_model_loads(capsys):
    """vf-serve on a taken port loaded the model, said it was serving, then failed with
    uvicorn's errno; a model that does not exist shows that the port is checked first."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert vf_serve(["/no/such/model", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"--port {port}" in err and "not free" in err and "Traceback" not in err


def test_config_refuses_the_same_values_when_built_in_python():
    with pytest.raises(ValueError, match="--max-num-seqs"):
        ServeConfig("m", max_num_seqs=0)
    with pytest.raises(ValueError, match="--dtype"):
        ServeConfig("m", dtype="bf16")
    with pytest.raises(ValueError, match="model is empty"):
        ServeConfig("")


# ---- HTTP requests: (route, body changes, status, param or word expected) ----
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TEXT = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
BAD_REQUESTS = [
    ("chat", {"temperature": -1}, 400, "temperature"),
    ("chat", {"top_p": 2}, 400, "top_p"),
    ("chat", {"top_p": 0}, 400, "top_p"),
    ("chat", {"n": 0}, 400, "n"),
    ("chat", {"n": 100000}, 400, "n"),
    ("chat", {"max_tokens": -5}, 400, "max_tokens"),
    ("chat", {"max_tokens": 10**9}, 400, "maximum context length"),
    ("chat", {"logprobs": True, "top_logprobs": 10**6}, 400, "top_logprobs"),
    ("chat", {"min_p": 1.5}, 400, "min_p"),
    ("chat", {"top_k": -7}, 400, "top_k"),
    ("chat", {"repetition_penalty": 0}, 400, "repetition_penalty"),
    ("chat", {"presence_penalty": 9}, 400, "presence_penalty"),
    ("chat", {"seed": 2**80}, 400, "seed"),
    ("chat", {"stop": 5}, 400, "stop"),
    ("chat", {"messages": []}, 400, "messages"),
    ("chat", {"messages": "hi"}, 400, "messages"),
    ("chat", {"messages": [{"content": "no role"}]}, 400, "role"),
    ("chat", {"messages": [{"role": "user", "content": 7}]}, 400, "messages"),
    ("chat", {"tools": "not a list"}, 400, "tools"),
    ("chat", {"model": "nope"}, 404, "nope"),
    ("chat", {"best_of": 4}, 400, "best_of"),
    ("chat", {"use_beam_search": True}, 400, "use_beam_search"),
    ("chat", {"logit_bias": {"5": 10}}, 400, "logit_bias"),
    ("chat", {"min_tokens": 3}, 400, "min_tokens"),
    ("chat", {"guided_json": {"type": "object"}}, 400, "guided_json"),
    ("chat", {"response_format": {"type": "json_object"}}, 400, "response_format"),
    ("chat", {"prompt_logprobs": 2}, 400, "prompt_logprobs"),
    ("text", {"logprobs": 10**6}, 400, "logprobs"),
    ("text", {"prompt": [-1]}, 400, "prompt"),
    ("text", {"prompt": [1, 10**9]}, 400, "prompt[1]"),  # not a token of the model
    ("text", {"prompt": [[1, 2], [3, 10**9]]}, 400, "prompt[1][1]"),
    ("text", {"prompt": [[1, 2], "mixed"]}, 400, "prompt"),
    ("text", {"prompt": ""}, 400, "prompt"),
    ("text", {"echo": True}, 400, "echo"),
    ("text", {"suffix": "tail"}, 400, "suffix"),
    ("text", {"temperature": float("nan")}, 400, "temperature"),
    ("text", {"temperature": float("inf")}, 400, "temperature"),
    ("text", {"max_tokens": "many"}, 400, "max_tokens"),
    # each of these was served (200) as if the field were not there, or was a 500
    ("chat", {"stop": ["x"] * 65}, 400, "stop"),
    ("chat", {"stop": ["x" * 513]}, 400, "stop"),
    ("chat", {"messages": [{"role": "assistant", "content": "x", "tool_calls": ["oops"]}]},
     400, "messages[0].tool_calls[0]"),
    ("chat", {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": 5}]}]},
     400, "messages[0].tool_calls[0]"),
    ("chat", {"messages": [{"role": None, "content": "x"}]}, 400, "messages[0].role"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
     400, "messages[0].content[0]"),
    ("chat", {"messages": [{"role": "user", "content": [5]}]}, 400, "messages[0].content[0]"),
    ("chat", {"tool_choice": "bogus"}, 400, "tool_choice"),
    ("chat", {"tool_choice": "required"}, 400, "tool_choice"),
    ("chat", {"top_logprobs": 5}, 400, "top_logprobs"),
    ("chat", {"continue_final_message": True, "add_generation_prompt": True},
     400, "add_generation_prompt"),
    ("chat", {"stop_token_ids": [-1]}, 400, "stop_token_ids[0]"),
    ("text", {"stop_token_ids": [10**9]}, 400, "stop_token_ids[0]"),
    ("chat", {"repetition_penalty": 1e-300}, 400, "repetition_penalty"),
    ("text", {"stream_options": {"include_usage": True}}, 400, "stream_options"),
]


@pytest.fixture(scope="module")
def server(tiny_model_path):
    config = ServeConfig(
        str(tiny_model_path), served_model_name="tiny", dtype="float32", threads=1,
        max_request_bytes=2**20,
    )  # fmt: skip
    with BackgroundServer(config) as srv:
        yield srv


def post(server, route: str, body: dict, **kw) -> httpx.Response:
    content = json.dumps(body)  # allows NaN / Infinity literals, as a careless client sends
    headers = {"Content-Type": "application/json"}
    return httpx.post(f"{server.base_url}{route}", content=content, headers=headers, **kw)


@pytest.mark.parametrize(
    ("kind", "changes", "status", "named"),
    BAD_REQUESTS,
    ids=[f"{k}-{next(iter(c))}={str(next(iter(c.values())))[:12]}" for k, c, _, _ in BAD_REQUESTS],
)
def test_bad_requests_get_a_4xx_that_names_the_field(server, kind, changes, status, named):
    route, base = ("/chat/completions", CHAT) if kind == "chat" else ("/completions", TEXT)
    r = post(server, route, {**base, **changes}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert named in error["message"] or error["param"] == named, error


def test_a_schema_error_names_its_field_as_param(server):
    r = post(server, "/chat/completions", {**CHAT, "messages": [{"role": "user"}], "n": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    r = post(server, "/completions", {**TEXT, "max_tokens": 10**6})  # the prompt is the field
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def test_a_body_that_is_not_json_says_so(server):
    r = httpx.post(f"{server.base_url}/chat/completions", content=b'{"model": ',
                   headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"], r.text
    r = httpx.post(f"{server.base_url}/chat/completions", content=json.dumps(CHAT))  # no type
    assert r.status_code == 400 and "application/json" in r.json()["error"]["message"], r.text


LONE_SURROGATES = [  # json.dumps escapes them as \ud800, as a Python client sends them
    ("/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "a\ud800"}]},
     "messages[0].content"),
    ("/completions", {**TEXT, "prompt": "a\udc00"}, "prompt"),
    ("/completions", {**TEXT, "model": "x\ud800"}, "model"),
    ("/unload_lora_adapter", {"lora_name": "\ud800"}, "lora_name"),
    ("/load_lora_adapter", {"lora_name": "n", "lora_path": "/tmp/\ud800"}, "lora_path"),
]


@pytest.mark.parametrize(("route", "body", "field"), LONE_SURROGATES,
                         ids=[f for _, _, f in LONE_SURROGATES])  # fmt: skip
def test_a_lone_surrogate_is_a_400_naming_the_field(server, route, body, field):
    r = post(server, route, body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text


def test_the_server_still_serves_after_the_hostile_table(server):
    r = post(server, "/chat/completions", CHAT, timeout=30)
    assert r.status_code == 200, r.text


# ---- body size ----
def test_an_oversized_body_is_413_and_health_keeps_answering(server):
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (20 * 2**20)}]}
    answers: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: answers.append(post(server, "/chat/completions", big, timeout=60))
    )
    sender.start()
    while sender.is_alive():
        t0 = time.monotonic()
        assert httpx.get(server.base_url.removesuffix("/v1") + "/health").status_code == 200
        assert time.monotonic() - t0 < 1.0
        time.sleep(0.05)
    sender.join()
    assert answers[0].status_code == 413, answers[0].text[:300]
    assert "--max-request-bytes" in answers[0].json()["error"]["message"]


def test_a_chunked_body_past_the_limit_is_413(server):
    def chunks():
        yield json.dumps(CHAT)[:-1].encode() + b', "pad": "'
        for _ in range(40):
            yield b"y" * 2**16  # 2.5 MiB in all, no Content-Length
        yield b'"}'

    r = httpx.post(
        f"{server.base_url}/chat/completions", content=chunks(),
        headers={"Content-Type": "application/json"}, timeout=30,
    )  # fmt: skip
    assert r.status_code == 413, r.text


def test_a_20_mb_body_under_a_raised_limit_leaves_health_responsive(tiny_model_path):
    config = ServeConfig(
        str(tiny_model_path), served_model_name="tiny", dtype="float32", threads=1,
        max_request_bytes=32 * 2**20,
    )  # fmt: skip
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (20 * 2**20)}]}
    with BackgroundServer(config) as srv:
        answers: list[httpx.Response] = []
        sender = threading.Thread(
            target=lambda: answers.append(post(srv, "/chat/completions", big, timeout=600))
        )
        started = time.monotonic()
        sender.start()
        slowest = 0.0
        while sender.is_alive():
            t0 = time.monotonic()
            assert httpx.get(srv.base_url.removesuffix("/v1") + "/health").status_code == 200
            slowest = max(slowest, time.monotonic() - t0)
            time.sleep(0.05)
        sender.join()
    # before: the loop parsed and tokenized it (/health waited 21 s, the tokenizing ~2 min);
    # now the loop only parses JSON, and the prompt is refused before it is tokenized
    assert slowest < 2.0
    assert time.monotonic() - started < 60
    assert answers[0].status_code == 400  # it is read, and refused for the context length
    assert "maximum context length" in answers[0].json()["error"]["message"]
