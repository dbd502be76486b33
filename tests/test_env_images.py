"""Images in environments: dataset image columns, tools that return images, parsers and rubrics
over multimodal messages, all through the scripted server (real HTTP, real openai client)."""

from __future__ import annotations

import io

import datasets
import pytest
from PIL import Image

import vfkit as vf
from vfkit.envs.content import tool_content
from vfkit.envs.dataset import build_prompt, clean_messages, format_dataset
from vfkit.envs.trajectory import check_extension
from vfkit.errors import ConfigError
from vfkit.images import image_part, load_image, message_image_urls
from vfkit.testing.scripted_server import Reply, TestServer


def red(size: int = 8) -> Image.Image:
    return Image.new("RGB", (size, size), (255, 0, 0))


def test_an_image_column_becomes_image_parts_before_the_question() -> None:
    rows = [{"question": "colour?", "answer": "red", "image": red(), "images": None},
            {"question": "colours?", "answer": "red", "image": None, "images": [red(), red(4)]},
            {"question": "none?", "answer": "", "image": None, "images": None}]  # fmt: skip
    ds = format_dataset(rows, system_prompt="Be brief.")
    assert "image" not in ds.column_names and "images" not in ds.column_names  # in the prompt now
    system, user = ds[0]["prompt"]
    assert system["content"] == [{"type": "text", "text": "Be brief."}]  # one type per column
    assert [p["type"] for p in user["content"]] == ["image_url", "text"]
    assert user["content"][-1]["text"] == "colour?"
    assert load_image(message_image_urls(ds[0]["prompt"])[0]).getpixel((0, 0)) == (255, 0, 0)
    assert len(message_image_urls(ds[1]["prompt"])) == 2
    assert ds[2]["prompt"][1]["content"] == [{"type": "text", "text": "none?"}]


@pytest.mark.parametrize("decode", [True, False])
def test_a_datasets_image_column_decoded_or_not(decode: bool) -> None:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (0, 255, 0)).save(buf, format="PNG")
    features = datasets.Features({"question": datasets.Value("string"),
                                  "image": datasets.Image(decode=decode)})  # fmt: skip
    ds = datasets.Dataset.from_dict(
        {"question": ["colour?"], "image": [{"bytes": buf.getvalue(), "path": None}]},
        features=features)
    env = vf.SingleTurnEnv(dataset=ds)
    (url,) = message_image_urls(env.get_dataset()[0]["prompt"])
    assert load_image(url).getpixel((0, 0)) == (0, 255, 0)


def test_rows_with_a_prompt_keep_it_and_completion_mode_refuses_images() -> None:
    prompt = [{"role": "user", "content": [image_part(red()), {"type": "text", "text": "hi"}]}]
    ds = format_dataset([{"prompt": prompt, "answer": "x"}], system_prompt="sys")
    # Arrow fills absent struct fields with None; the rollout's prompt has them removed
    cleaned = clean_messages(ds[0]["prompt"])
    assert cleaned == [{"role": "system", "content": [{"type": "text", "text": "sys"}]}, *prompt]
    with pytest.raises(ConfigError, match="message_type='chat'"):
        build_prompt("q", message_type="completion", images=[red()])


def test_tool_results_images_become_parts_text_stays_text() -> None:
    assert tool_content("4") == "4" and tool_content(4) == "4"
    assert tool_content({"a": 1}) == '{"a": 1}'
    parts = tool_content(red())
    assert parts[0]["type"] == "image_url" and parts[0]["image_url"]["url"].startswith("data:")
    mixed = tool_content([{"type": "text", "text": "crop:"}, red()])
    assert [p["type"] for p in mixed] == ["text", "image_url"]


def look(colour: str) -> Image.Image:
    """Show a swatch of a colour.

    Args:
        colour: red or blue.
    """
    if colour not in ("red", "blue"):
        raise ValueError(f"no swatch {colour!r}; use red or blue")
    return Image.new("RGB", (6, 6), (255, 0, 0) if colour == "red" else (0, 0, 255))


async def test_a_tool_image_reaches_the_model_in_the_next_turn() -> None:
    env = vf.ToolEnv(tools=[look], dataset=[{"question": "q", "answer": "blue"}], max_turns=4)
    script = [Reply(tool_calls=[{"name": "look", "arguments": {"colour": "blue"}}]),
              Reply(tool_calls=[{"name": "look", "arguments": {"colour": "green"}}]),
              "<answer>blue</answer>"]  # fmt: skip
    with TestServer(script) as server:
        state = await env.run_rollout(env.get_dataset()[0], server.client(), "m")
    assert state["error"] is None and state["turn"] == 3
    second = server.requests[1]["messages"]
    tool_msg = second[-1]
    assert tool_msg["role"] == "tool" and tool_msg["content"][0]["type"] == "image_url"
    pixel = load_image(tool_msg["content"][0]["image_url"]["url"]).getpixel((0, 0))
    assert pixel == (0, 0, 255)  # the blue swatch the tool drew, as the server received it
    bad = server.requests[2]["messages"][-1]
    assert bad["content"].startswith("Error: tool 'look' raised ValueError: no swatch 'green'")
    # every turn's token ids extend the previous turn's, and only sampled tokens are trained on
    steps = state["trajectory"]
    assert check_extension(steps)
    for step in steps:
        tokens = step["tokens"]
        assert len(tokens["completion_ids"]) == len(tokens["completion_mask"]) > 0
        assert set(tokens["prompt_mask"]) == {0} and set(tokens["completion_mask"]) == {1}
        assert len(tokens["completion_logprobs"]) == len(tokens["completion_ids"])


async def test_tool_images_can_go_to_a_user_message_for_openai() -> None:
    env = vf.ToolEnv(tools=[look], dataset=[{"question": "q", "answer": "red"}], max_turns=3,
                     tool_images="user")  # the OpenAI API takes images only from users
    script = [Reply(tool_calls=[{"name": "look", "arguments": {"colour": "red"}}]), "red"]
    with TestServer(script) as server:
        state = await env.run_rollout(env.get_dataset()[0], server.client(), "m")
    assert state["error"] is None and state["turn"] == 2
    tool_msg, user_msg = server.requests[1]["messages"][-2:]
    assert tool_msg["role"] == "tool" and tool_msg["content"] == (
        "[1 image(s) in the next user message]")
    assert user_msg["role"] == "user" and user_msg["content"][0]["type"] == "text"
    (url,) = message_image_urls([user_msg])
    assert load_image(url).getpixel((0, 0)) == (255, 0, 0)
    with pytest.raises(ConfigError, match="tool_images must be 'tool'"):
        vf.ToolEnv(tools=[look], tool_images="system")


async def test_parsers_and_rubrics_see_multimodal_messages_as_they_are() -> None:
    seen = {}

    def exact(prompt, completion, parser, answer) -> float:
        seen["prompt"] = prompt
        return float(parser.parse_answer(completion) == answer)

    parser = vf.XMLParser(["answer"])
    rows = [{"question": "colour?", "answer": "red", "image": red()}]
    env = vf.SingleTurnEnv(dataset=rows, parser=parser,
                           rubric=vf.Rubric(funcs=[exact, parser.get_format_reward_func()],
                                            parser=parser))
    with TestServer("<answer>red</answer>") as server:
        state = await env.run_rollout(env.get_dataset()[0], server.client(), "m")
    assert state["error"] is None and state["reward"] == 2.0  # exact 1 + format 1
    assert seen["prompt"][-1]["content"][0]["type"] == "image_url"  # untouched, with pixels
    # the image arrived in the request; a multimodal assistant message parses like text
    assert message_image_urls(server.requests[0]["messages"])
    reply = [{"role": "assistant", "content": [image_part(red()),
                                               {"type": "text", "text": "<answer>red</answer>"}]}]
    assert parser.parse_answer(reply) == "red" and parser.get_format_reward_func()(reply) == 1.0


async def test_an_env_group_mixes_image_and_text_environments() -> None:
    """Arrow holds one type per column: the text env's prompts become text parts in the group."""
    seeing = vf.SingleTurnEnv(dataset=[{"question": "colour?", "answer": "red", "image": red()}])
    reading = vf.SingleTurnEnv(dataset=[{"question": "say red", "answer": "red"}])
    group = vf.EnvGroup([seeing, reading], env_names=["seeing", "reading"])
    rows = group.get_dataset()
    assert [r["task"] for r in rows] == ["seeing", "reading"]
    with TestServer("red") as server:
        states = [await group.run_rollout(r, server.client(), "m") for r in rows]
    assert [s["error"] for s in states] == [None, None]
    assert len(message_image_urls(server.requests[0]["messages"])) == 1
    assert server.requests[1]["messages"][-1]["content"] == [{"type": "text", "text": "say red"}]
