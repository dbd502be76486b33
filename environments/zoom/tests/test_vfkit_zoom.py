"""zoom: the tool's crop reaches the model's next request; bad boxes are tool errors; the token
ids of a multi-turn image rollout stay consistent; curiosity bonus and overuse penalty."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vfkit.envs.trajectory import check_extension
from vfkit.images import load_image, message_image_urls
from vfkit.testing.scripted_server import Reply, TestServer

ENV_DIR = str(Path(__file__).resolve().parents[1])
if ENV_DIR not in sys.path:  # importable from a checkout, installed or not
    sys.path.insert(0, ENV_DIR)

import vfkit_zoom as zoom  # noqa: E402  # after the path line above


def small_env(**kwargs):
    # max_tokens: the scripted server's tokenizer spends a token per byte of a tool call
    return zoom.load_environment(num_train_examples=8, num_eval_examples=4, max_tokens=400,
                                 **kwargs)


def zoom_call(*box: float) -> Reply:
    return Reply(tool_calls=[{"name": "zoom", "arguments": dict(zip(["x1", "y1", "x2", "y2"], box,
                                                                    strict=True))}])


def test_scenes_are_seeded_and_the_digit_is_only_readable_zoomed_in() -> None:
    a, b = small_env(), small_env()
    assert a.get_eval_dataset()["prompt"] == b.get_eval_dataset()["prompt"]
    assert not {r["info"]["scene_seed"] for r in a.get_dataset()} & {
        r["info"]["scene_seed"] for r in a.get_eval_dataset()}
    row = a.get_eval_dataset()[0]
    (url,) = message_image_urls(row["prompt"])
    assert load_image(url).size == (128, 128)
    scenes, seed = a.scenes, row["info"]["scene_seed"]
    _, digit, (x0, y0, x1, y1) = scenes.scene(seed)
    assert digit == row["answer"] and (x1 - x0, y1 - y0) == (10, 14)  # 5x7 glyph pixels of 2 px
    # in the 128 px view the 10x14 px tag is 2.5x3.5 px: one glyph pixel is half a view pixel
    tx0, ty0, tx1, ty1 = row["info"]["tag_box"]
    crop = scenes.crop(seed, tx0, ty0, tx1, ty1)
    assert max(crop.size) == 128  # enlarged to zoom_size
    assert (255, 255, 255) in {crop.getpixel((x, y)) for x in range(crop.width)
                               for y in range(crop.height)}  # fmt: skip


@pytest.mark.parametrize(("box", "problem"), [
    ((10, 10, 200, 20), "coordinates must lie in 0..128"),
    ((50, 10, 20, 30), "need x1 < x2 and y1 < y2"),
    ((-1, 0, 5, 5), "coordinates must lie in 0..128"),
])  # fmt: skip
def test_bad_boxes_are_refused_with_the_reason(box: tuple, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        small_env().scenes.check_box(*box)


async def test_the_crop_reaches_the_next_turn_and_tokens_stay_consistent() -> None:
    env = small_env()
    row = env.get_eval_dataset()[0]
    x0, y0, x1, y1 = row["info"]["tag_box"]
    box = (max(0, x0 - 4), max(0, y0 - 4), min(128, x1 + 4), min(128, y1 + 4))
    script = [zoom_call(*box), zoom_call(90, 10, 300, 20), f"<answer>{row['answer']}</answer>"]
    with TestServer(script) as server:
        state = await env.run_rollout(row, server.client(), "m")
    assert state["error"] is None and state["turn"] == 3 and state["reward"] == 1.0
    assert state["metrics"]["zoom_calls"] == 2.0
    tool_msg = server.requests[1]["messages"][-1]  # what the model got after its first call
    assert tool_msg["role"] == "tool"
    assert tool_msg["content"][0] == {"type": "text", "text": "zoom({}, {}, {}, {}):".format(*box)}
    (url,) = message_image_urls([tool_msg])
    expected = env.scenes.crop(row["info"]["scene_seed"], *box)
    assert list(load_image(url).getdata()) == list(expected.getdata())  # the crop, pixel-exact
    # the prompt image and the crop both travel in the second request, in order
    assert len(message_image_urls(server.requests[1]["messages"])) == 2
    error = server.requests[2]["messages"][-1]["content"]
    assert error.startswith("Error: tool 'zoom' raised ValueError: zoom(90, 10, 300, 20): "
                            "coordinates must lie in 0..128")
    assert check_extension(state["trajectory"])  # each turn's ids extend the previous turn's
    for step in state["trajectory"]:
        tokens = step["tokens"]
        assert len(tokens["completion_mask"]) == len(tokens["completion_ids"]) > 0
        assert set(tokens["prompt_mask"]) == {0} and set(tokens["completion_mask"]) == {1}


def rollout(calls: int, answer: str, digit: str = "7") -> dict:
    """A hand-built scored-to-be state: `calls` zooms, then an answer."""
    completion = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function",
         "function": {"name": "zoom", "arguments": '{"x1": 0, "y1": 0, "x2": 8, "y2": 8}'}}]}
        for i in range(calls)]  # fmt: skip
    completion.append({"role": "assistant", "content": f"<answer>{answer}</answer>"})
    return {"prompt": [], "completion": completion, "answer": digit, "info": {}, "error": None}


async def test_curiosity_bonus_and_overuse_penalty_numbers() -> None:
    env = small_env(curiosity_weight=0.5, curiosity_threshold=0.3, overuse_weight=0.05,
                    max_free_zooms=1)
    group = [rollout(3, "7"), rollout(0, "7"), rollout(0, "1"), rollout(0, "7")]
    await env.rubric.score_group(group)
    # zoom rate in the group 1/4: bonus max(0.3 - 0.25, 0) = 0.05 for the one that zoomed
    assert [s["metrics"]["curiosity_bonus"] for s in group] == pytest.approx([0.05, 0, 0, 0])
    # 3 zooms with 1 free: min(1 - 3, 0) = -2
    assert [s["metrics"]["overuse_penalty"] for s in group] == [-2.0, 0.0, 0.0, 0.0]
    # reward = correct + 0.5 * bonus + 0.05 * penalty = 1 + 0.025 - 0.1 = 0.925
    assert [s["reward"] for s in group] == pytest.approx([0.925, 1.0, 0.0, 1.0])
    busy = [rollout(1, "7"), rollout(1, "7"), rollout(0, "7")]  # rate 2/3 >= 0.3: no bonus
    await env.rubric.score_group(busy)
    assert [s["metrics"]["curiosity_bonus"] for s in busy] == [0.0, 0.0, 0.0]
    assert [s["reward"] for s in busy] == [1.0, 1.0, 1.0]  # one zoom is free


async def test_curiosity_is_off_by_default_but_recorded() -> None:
    env = small_env()
    group = [rollout(3, "7"), rollout(0, "7"), rollout(0, "7"), rollout(0, "7")]
    await env.rubric.score_group(group)
    assert group[0]["metrics"]["curiosity_bonus"] == pytest.approx(0.05)
    assert group[0]["metrics"]["overuse_penalty"] == -2.0
    assert [s["reward"] for s in group] == [1.0, 1.0, 1.0, 1.0]
