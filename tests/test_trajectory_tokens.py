"""Multi-turn token consistency: step k+1's prompt ids extend step k's prompt + completion ids."""

from __future__ import annotations

import itertools
import logging

from vfkit.envs.multiturn_env import MultiTurnEnv
from vfkit.envs.tool_env import ToolEnv
from vfkit.envs.trajectory import check_extension, extension_breaks
from vfkit.testing.scripted_server import TestServer
from vfkit.testing.tiny_model import make_tokenizer

ROWS = [{"question": "Say something.", "answer": ""}]

# ChatML that, like Qwen3's template, drops <think>...</think> from earlier assistant turns.
THINK_STRIPPING_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = message.content or '' %}"
    "{% if message.role == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "<|im_start|>{{ message.role }}\n{{ content }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatEnv(MultiTurnEnv):
    """Replies "go on" until max_turns; never stops for a cut completion (to test that case)."""

    async def env_response(self, messages, state):
        return [{"role": "user", "content": "go on"}]

    def max_tokens_reached(self, state) -> bool:  # still a stop condition, now never true
        return False


def add(a: int, b: int) -> int:
    """Add."""
    return a + b


async def rollout(env, script, **server_kwargs):
    with TestServer(script, **server_kwargs) as srv:
        return await env.run_rollout(env.get_dataset()[0], srv.client(), "m", {"max_tokens": 200})


async def test_chatml_turns_extend():
    state = await rollout(ChatEnv(dataset=ROWS, max_turns=3), ["one", "two", "three"])
    steps = state["trajectory"]
    assert len(steps) == 3 and check_extension(steps) and state["trajectory_extends"] is True
    newline = make_tokenizer().encode("\n")
    for prev, cur in itertools.pairwise(steps):
        head = prev["tokens"]["prompt_ids"] + prev["tokens"]["completion_ids"]
        assert cur["tokens"]["prompt_ids"][: len(head)] == head
        # the sampled ids end with <|im_end|>; the template's "\n" comes right after the prefix
        assert prev["tokens"]["completion_ids"][-1] == make_tokenizer().eos_token_id
        assert cur["tokens"]["prompt_ids"][len(head): len(head) + 1] == newline


async def test_completion_cut_at_max_tokens_still_extends():
    with TestServer(["abcdefgh", "ok"]) as srv:
        env = ChatEnv(dataset=ROWS, max_turns=2)
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m", {"max_tokens": 3})
    first = state["trajectory"][0]["tokens"]
    assert first["is_truncated"] and first["completion_ids"] == make_tokenizer().encode("abc")
    # no eos was sampled; the template closes the turn with <|im_end|> after "abc": still a prefix
    assert state["turn"] == 2 and check_extension(state["trajectory"])


class TextEnv(MultiTurnEnv):
    """Completion mode: the environment appends text after each model turn."""

    def env_response(self, messages, state):
        return "\nUser: go on\nAssistant:"


async def test_completion_mode_turns_extend_without_the_sampled_eos(caplog):
    env = TextEnv(dataset=[{"prompt": "Q:", "answer": ""}], message_type="completion",
                  max_turns=3)
    with caplog.at_level(logging.WARNING, logger="vfkit.envs.model_calls"):
        state = await rollout(env, " A1")
    steps = state["trajectory"]
    eos = make_tokenizer().eos_token_id
    assert [s["tokens"]["completion_ids"][-1] for s in steps] == [eos] * 3  # each stopped
    assert state["trajectory_extends"] is True and check_extension(steps)
    assert "do not extend" not in caplog.text
    # the eos is the only id the next prompt leaves out
    head = steps[0]["tokens"]["prompt_ids"] + steps[0]["tokens"]["completion_ids"][:-1]
    assert steps[1]["tokens"]["prompt_ids"][: len(head)] == head


async def test_tool_call_turns_extend():
    env = ToolEnv(tools=[add], dataset=ROWS, max_turns=3)
    script = ['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "3"]
    state = await rollout(env, script)
    assert state["turn"] == 2 and state["trajectory_extends"] is True


async def test_think_stripping_template_is_detected_and_reported(caplog):
    tokenizer = make_tokenizer()
    tokenizer.chat_template = THINK_STRIPPING_TEMPLATE
    script = ["<think>hmm</think>one", "<think>more</think>two"]
    with caplog.at_level(logging.WARNING, logger="vfkit.envs.model_calls"):
        state = await rollout(ChatEnv(dataset=ROWS, max_turns=2), script, tokenizer=tokenizer)
    steps = state["trajectory"]
    assert extension_breaks(steps) == [1] and not check_extension(steps)
    assert state["trajectory_extends"] is False and state["error"] is None
    assert "do not extend" in caplog.text
    # the server really saw history without the earlier reasoning
    assert "<think>hmm</think>" not in tokenizer.decode(steps[1]["tokens"]["prompt_ids"])


def test_steps_without_tokens_are_skipped():
    with_ids = {"tokens": {"prompt_ids": [1], "completion_ids": [2], "overlong_prompt": False}}
    assert check_extension([{"tokens": None}, with_ids, {"tokens": None}])
    other = {"tokens": {"prompt_ids": [9, 9], "completion_ids": [3], "overlong_prompt": False}}
    assert extension_breaks([with_ids, other]) == [1]
