"""Rollout client: sampling args, one model call over HTTP, token fields, overflow detection."""

from __future__ import annotations

import openai
import pytest

from vfkit.client.chat_call import (
    call_model,
    cap_max_tokens,
    is_context_overflow,
    prepare_sampling_args,
    response_message,
)
from vfkit.client.tokens import parse_tokens
from vfkit.errors import ContextOverflowError
from vfkit.testing.scripted_server import Reply, TestServer
from vfkit.testing.tiny_model import make_tokenizer


def test_prepare_sampling_args_moves_vllm_knobs_to_extra_body():
    args = prepare_sampling_args({"temperature": 0.7, "top_k": 5, "min_p": 0.1,
                                  "extra_body": {"repetition_penalty": 1.1}}, "chat")
    assert args == {"temperature": 0.7, "logprobs": True,
                    "extra_body": {"repetition_penalty": 1.1, "top_k": 5, "min_p": 0.1,
                                   "return_token_ids": True}}
    # completions take an int for logprobs; an explicit opt-out of token ids is kept
    args = prepare_sampling_args({"extra_body": {"return_token_ids": False}}, "completion")
    assert args["logprobs"] == 1 and args["extra_body"]["return_token_ids"] is False


def test_cap_max_tokens_keeps_the_smaller_limit():
    assert cap_max_tokens({"max_tokens": 100}, 30)["max_tokens"] == 30
    assert cap_max_tokens({"max_tokens": 10}, 30)["max_tokens"] == 10
    assert cap_max_tokens({}, 30)["max_tokens"] == 30
    assert cap_max_tokens({"max_completion_tokens": 50}, 20) == {"max_completion_tokens": 20}


def _response(prompt_ids, ids, finish="stop", logprob=-1.0):
    content = [{"token": "x", "logprob": logprob, "bytes": [120]} for _ in ids]
    return {"prompt_token_ids": prompt_ids,
            "choices": [{"token_ids": ids, "finish_reason": finish,
                         "logprobs": {"content": content}}]}


def test_parse_tokens_applies_max_seq_len():
    full = parse_tokens(_response([1, 2, 3], [4, 5, 6]))
    assert full["completion_ids"] == [4, 5, 6] and full["prompt_mask"] == [0, 0, 0]
    assert full["completion_mask"] == [1, 1, 1] and not full["is_truncated"]
    # 3 prompt + 3 completion > 5: the completion keeps 5 - 3 = 2 tokens
    cut = parse_tokens(_response([1, 2, 3], [4, 5, 6]), max_seq_len=5)
    assert cut["completion_ids"] == [4, 5] and cut["completion_logprobs"] == [-1.0, -1.0]
    assert cut["is_truncated"] and not cut["overlong_prompt"]
    over = parse_tokens(_response([1, 2, 3], [4, 5, 6]), max_seq_len=2)
    assert over["overlong_prompt"] and over["completion_ids"] == [] and over["prompt_ids"] == [1, 2]
    assert parse_tokens(_response([1], [2], finish="length"))["is_truncated"]


def test_parse_tokens_none_without_ids_or_logprobs():
    assert parse_tokens({"choices": [{"message": {}, "finish_reason": "stop"}]}) is None
    no_lp = _response([1], [2])
    no_lp["choices"][0]["logprobs"] = None
    assert parse_tokens(no_lp) is None


async def test_call_model_chat_and_completion_round_trip():
    tok = make_tokenizer()
    with TestServer(["hi there", Reply(content="abc")]) as srv:
        client = srv.client()
        chat = await call_model(client, "m", [{"role": "user", "content": "q"}],
                                prepare_sampling_args({"max_tokens": 20}, "chat"))
        text = await call_model(client, "m", "prefix:",
                                prepare_sampling_args({"max_tokens": 20}, "completion"))
    assert response_message(chat) == {"role": "assistant", "content": "hi there"}
    tokens = parse_tokens(chat)
    assert tokens["completion_ids"] == [*tok.encode("hi there"), tok.eos_token_id]
    assert srv.requests[0]["return_token_ids"] is True and srv.requests[0]["logprobs"] is True
    assert text["choices"][0]["text"] == "abc"
    assert parse_tokens(text)["prompt_ids"] == tok.encode("prefix:")


async def test_call_model_maps_overflow_and_keeps_other_errors():
    with TestServer(["x"], max_context=10) as srv:
        client = srv.client(max_retries=0)
        with pytest.raises(ContextOverflowError, match="maximum context length"):
            await call_model(client, "m", [{"role": "user", "content": "long" * 10}], {})
        srv.responder = []  # an empty script: the next request is a plain 400
        with pytest.raises(openai.BadRequestError) as err:
            await call_model(client, "m", "q", {"max_tokens": 1})
    assert not is_context_overflow(err.value)


async def test_server_knobs_the_sdk_does_not_know_reach_the_body():
    """prime-rl's sampling (through verifiers 0.4) puts vLLM's `cache_salt` and
    `chat_template_kwargs` at the top level; the SDK's create() refused them, so every call
    failed before any request was sent."""
    args = {"max_tokens": 5, "cache_salt": "s1", "chat_template_kwargs": {"enable_thinking": False},
            "extra_body": {"top_k": 3}}
    with TestServer(["ok", "ok"]) as srv:
        client = srv.client()
        await call_model(client, "m", [{"role": "user", "content": "q"}],
                         prepare_sampling_args(args, "chat"))
        await call_model(client, "m", "prefix:", prepare_sampling_args(args, "completion"))
    for body in srv.requests:
        assert body["cache_salt"] == "s1" and body["top_k"] == 3 and body["max_tokens"] == 5
        assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_context_room_reads_the_servers_overflow_message():
    from vfkit.client.chat_call import context_room

    vllm = ("This model's maximum context length is 4096 tokens. However, you requested 5080 "
            "tokens (80 in the messages, 5000 in the completion). Please reduce the length.")
    newer = ("'max_tokens' or 'max_completion_tokens' is too large: 5000. This model's maximum "
             "context length is 4096 tokens and your request has 80 input tokens (5000 > 4096 - "
             "80).")
    assert context_room(vllm) == context_room(newer) == 4016
    assert context_room("This model's maximum context length is 100 tokens. However, you "
                        "requested 150 tokens (150 in the messages, 0 in the completion).") == 0
    assert context_room("This model's maximum context length is 100 tokens.") is None


async def test_a_max_tokens_too_large_for_the_context_gets_the_room_left():
    """-t 5000 against a 100-token context: every rollout was recorded as prompt_too_long with
    reward 0 and an exit 0; the prompt fits, so the call is sent again with the room left."""
    from vfkit.envs.singleturn_env import SingleTurnEnv

    env = SingleTurnEnv(dataset=[{"question": "q", "answer": "a"}])
    with TestServer("fine", max_context=100) as srv:
        out = await env.a_evaluate(srv.client(), "m", {"max_tokens": 5000}, num_examples=1)
        bodies = list(srv.requests)
    state = out.states[0]
    assert state["stop_condition"] != "prompt_too_long" and state["completion"][-1]["content"]
    prompt_tokens = len(state["trajectory"][0]["tokens"]["prompt_ids"])
    assert [b["max_tokens"] for b in bodies] == [5000, 100 - prompt_tokens]
