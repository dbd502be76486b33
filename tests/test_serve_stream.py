"""`stream: true` on the embedded server, read with the real openai client (and raw SSE)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from vfkit.cli.serve import build_parser, config_from_args
from vfkit.serve.config import ServeConfig
from vfkit.serve.runner import BackgroundServer
from vfkit.serve.streaming import _stop_prefix_at_end

MESSAGES = [{"role": "user", "content": "Tell me a story"}]
IDS = {"return_token_ids": True}


@pytest.fixture(scope="module")
def server(tiny_model_path):
    config = ServeConfig(str(tiny_model_path), served_model_name="tiny", dtype="float32", threads=1)
    with BackgroundServer(config) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def test_chat_stream_matches_the_unstreamed_answer(client):
    """Same seed, same tokens: the chunks add up to the plain answer, ids and logprobs included."""
    args = {"model": "tiny", "messages": MESSAGES, "max_tokens": 12, "seed": 7, "logprobs": True,
                "top_logprobs": 2, "extra_body": IDS}  # fmt: skip
    plain = client.chat.completions.create(**args).model_dump()
    chunks = [
        c.model_dump()
        for c in client.chat.completions.create(
            **args, stream=True, stream_options={"include_usage": True}
        )
    ]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[0]["delta"]["role"] == "assistant"
    assert chunks[0]["prompt_token_ids"] == plain["prompt_token_ids"]
    text = "".join(c["delta"].get("content") or "" for c in choices)
    assert text == plain["choices"][0]["message"]["content"]
    token_ids = [t for c in choices for t in c["token_ids"]]
    assert token_ids == plain["choices"][0]["token_ids"]
    for c in choices:  # every chunk's logprobs are those of its own tokens
        assert len(c["logprobs"]["content"]) == len(c["token_ids"])
        assert all(len(e["top_logprobs"]) == 2 for e in c["logprobs"]["content"])
    streamed = [e["logprob"] for c in choices for e in c["logprobs"]["content"]]
    wanted = [e["logprob"] for e in plain["choices"][0]["logprobs"]["content"]]
    assert streamed == pytest.approx(wanted, abs=1e-5)
    assert [c["finish_reason"] for c in choices][-1] == plain["choices"][0]["finish_reason"]
    assert all(c["finish_reason"] is None for c in choices[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == plain["usage"]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["object"] == "chat.completion.chunk"


def test_completion_stream_with_two_prompts_and_n_2(client):
    args = {"model": "tiny", "prompt": ["Once upon", "a time"], "max_tokens": 6, "n": 2, "seed": 3,
                "logprobs": 1, "extra_body": IDS}  # fmt: skip
    plain = client.completions.create(**args).model_dump()["choices"]
    chunks = [c.model_dump() for c in client.completions.create(**args, stream=True)]
    by_index: dict[int, list[dict]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            by_index.setdefault(choice["index"], []).append(choice)
    assert sorted(by_index) == [0, 1, 2, 3]
    for want in plain:
        got = by_index[want["index"]]
        assert "".join(c["text"] for c in got) == want["text"]
        assert [t for c in got for t in c["token_ids"]] == want["token_ids"]
        assert got[0]["prompt_token_ids"] == want["prompt_token_ids"]
        offsets = [o for c in got for o in c["logprobs"]["text_offset"]]
        assert offsets == want["logprobs"]["text_offset"]  # offsets run on across chunks
        assert got[-1]["finish_reason"] == want["finish_reason"]


def test_stop_strings_are_never_streamed(client):
    """Text that may still become a stop string is held back; the total equals the plain one."""
    base = {"model": "tiny", "messages": MESSAGES, "max_tokens": 40, "seed": 11}
    full = client.chat.completions.create(**base).choices[0].message.content
    stop = full[5:7]  # two characters the model does produce
    plain = client.chat.completions.create(**base, stop=[stop]).choices[0]
    stream = client.chat.completions.create(**base, stop=[stop], stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == plain.message.content
    assert stop not in "".join(pieces)


def test_raw_sse_ends_with_done(server):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    assert json.loads(events[0][6:])["choices"][0]["delta"]["role"] == "assistant"


def test_stream_errors_before_the_first_token_are_plain_http_errors(client):
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=10**6, stream=True
        )
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MESSAGES, stream=True)


@pytest.mark.parametrize(
    "argv",
    [["some/model"], ["--model", "some/model"], ["some/model", "--model", "some/model"]],
)
def test_model_is_positional_or_a_flag(argv):
    assert config_from_args(build_parser().parse_args(argv)).model == "some/model"


@pytest.mark.parametrize("argv", [[], ["a", "--model", "b"]])
def test_model_missing_or_given_twice_is_named(argv, capsys):
    from vfkit.cli.serve import main

    with pytest.raises(SystemExit):
        main(argv)
    assert "model" in capsys.readouterr().err


def test_a_client_leaving_mid_stream_frees_its_row(server):
    import time

    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 900, "ignore_eos": True,
            "stream": True}  # fmt: skip
    stats = server.base_url.removesuffix("/v1") + "/stats"
    before = httpx.get(stats).json()["aborted"]
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # generation is under way; now hang up
    deadline = time.monotonic() + 30
    while httpx.get(stats).json()["aborted"] == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert httpx.get(stats).json()["aborted"] == before + 1
    assert httpx.get(stats).json()["running"] == 0


def test_chat_stream_with_n_2_keeps_choices_apart(client):
    extra = {**IDS, "return_tokens_as_token_ids": True}
    args = {"model": "tiny", "messages": MESSAGES, "max_tokens": 6, "n": 2, "seed": 5,
            "logprobs": True, "extra_body": extra}  # fmt: skip
    plain = client.chat.completions.create(**args).model_dump()["choices"]
    chunks = [c.model_dump() for c in client.chat.completions.create(**args, stream=True)]
    for want in plain:
        got = [ch for c in chunks for ch in c["choices"] if ch["index"] == want["index"]]
        assert got[0]["delta"]["role"] == "assistant"
        assert [t for c in got for t in c["token_ids"]] == want["token_ids"]
        tokens = [e["token"] for c in got for e in c["logprobs"]["content"]]
        assert tokens == [f"token_id:{t}" for t in want["token_ids"]]
        assert got[-1]["finish_reason"] == want["finish_reason"]


@pytest.mark.parametrize(
    ("text", "stop", "held"),
    [
        ("hello </ans", "</answer>", 5),  # the stop string's start is held back
        ("hello <", "</answer>", 1),
        ("hello", "</answer>", 0),
        ("aaab", "aab", 0),  # "b" ends the text, and no prefix of the stop ends in "b"
        ("xaa", "aab", 2),  # the longest ending that begins the stop: "aa", not "a"
        ("ab", "abab", 2),
        ("abab", "ababc", 4),
        ("abc", "c", 0),  # a one-character stop has no proper prefix to hold
        ("", "</answer>", 0),
    ],
)
def test_the_text_held_back_is_the_longest_ending_that_begins_a_stop(text, stop, held):
    assert _stop_prefix_at_end(text, stop) == held
