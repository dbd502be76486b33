"""shapes: scenes, questions and answers from a seed, scored through the scripted test server."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

import vfkit as vf
from vfkit.images import load_image, message_image_urls
from vfkit.testing.scripted_server import TestServer

ENV_DIR = str(Path(__file__).resolve().parents[1])
if ENV_DIR not in sys.path:  # importable from a checkout, installed or not
    sys.path.insert(0, ENV_DIR)

import vfkit_shapes as shapes  # noqa: E402  # after the path line above


def small_env(**kwargs) -> vf.Environment:
    return shapes.load_environment(num_train_examples=40, num_eval_examples=12, **kwargs)


def test_data_is_seeded_held_out_and_carries_the_image() -> None:
    a, b = small_env(), small_env()
    assert a.get_eval_dataset()["prompt"] == b.get_eval_dataset()["prompt"]  # pixels included
    train = {r["question"] + str(r["info"]) for r in a.get_dataset()}
    assert not train & {r["question"] + str(r["info"]) for r in a.get_eval_dataset()}
    row = a.get_eval_dataset()[0]
    assert row["task"] == "shapes" and row["prompt"][0]["role"] == "system"
    (url,) = message_image_urls(row["prompt"])
    assert load_image(url).size == (96, 96)
    assert row["prompt"][-1]["content"][-1]["text"] == row["question"]  # image, then question


def test_image_size_and_kinds_follow_the_args() -> None:
    env = small_env(image_size=64, kinds=["colour_at"])
    row = env.get_dataset()[0]
    assert load_image(message_image_urls(row["prompt"])[0]).size == (64, 64)
    assert all(r["question"].startswith("What colour") for r in env.get_dataset())
    with pytest.raises(ValueError, match="kinds"):
        small_env(kinds=["count_dogs"])
    with pytest.raises(ValueError, match="image_size"):
        small_env(image_size=8)


def test_answers_match_the_drawn_pixels() -> None:
    """The colour named for a cell is the colour painted at that cell's centre."""
    scene = [shapes.Shape("square", "blue", (0, 0)), shapes.Shape("circle", "red", (2, 1)),
             shapes.Shape("triangle", "red", (1, 2))]  # fmt: skip
    image = shapes.draw_scene(scene, 90)
    assert image.getpixel((15, 15)) == shapes.COLOURS["blue"]  # cell (0, 0) centre
    assert image.getpixel((45, 75)) == shapes.COLOURS["red"]  # cell (2, 1) centre
    assert image.getpixel((45, 45)) == (255, 255, 255)  # the empty centre cell
    rng = random.Random(0)
    answers = {}
    for _ in range(200):
        question, answer = shapes.ask(rng, scene, rng.choice(shapes.KINDS), ["red", "blue"])
        answers[question] = answer
    assert answers["How many red shapes are there?"] == "2"
    assert answers["How many circles are there?"] == "1"
    assert answers["What colour is the shape in the top-left cell?"] == "blue"
    compare = "Are there more red shapes or more blue shapes? Answer red, blue or same."
    assert answers[compare] == "red"


@pytest.mark.parametrize(("reply", "correct", "reward"), [
    ("<answer>{answer}</answer>", 1.0, 1.2),  # 1.0 + format 0.2 * 1.0
    ("<answer> {upper} </answer>", 1.0, 1.2),  # case and spaces do not matter
    ("<answer>{wrong}</answer>", 0.0, 0.0),  # wrong: no format credit either
    ("{answer}", 0.0, 0.0),  # no tags: no answer
])  # fmt: skip
async def test_answers_are_scored_right_or_wrong(reply: str, correct: float, reward: float) -> None:
    env = small_env(format_weight=0.2)
    row = env.get_eval_dataset()[0]
    wrong = "purple" if not row["answer"].isdigit() else str(int(row["answer"]) + 1)
    text = reply.format(answer=row["answer"], upper=row["answer"].upper(), wrong=wrong)
    with TestServer(text) as server:
        state = await env.run_rollout(row, server.client(), "m")
    assert state["error"] is None
    assert state["metrics"]["correct_answer"] == correct
    assert state["reward"] == pytest.approx(reward)
    assert server.requests[0]["max_tokens"] == 32  # the environment's default sampling args
    (url,) = message_image_urls(server.requests[0]["messages"])  # the scene reached the server
    assert url == message_image_urls(row["prompt"])[0]


async def test_a_perfect_model_scores_full_reward() -> None:
    env = small_env()
    answers = {r["question"] + r["prompt"][-1]["content"][0]["image_url"]["url"]: r["answer"]
               for r in env.get_eval_dataset()}  # fmt: skip

    def oracle(request: dict) -> str:
        content = request["messages"][-1]["content"]
        return f"<answer>{answers[content[-1]['text'] + content[0]['image_url']['url']]}</answer>"

    with TestServer(oracle) as server:
        out = await env.a_evaluate(server.client(), "m", rollouts_per_example=2)
    assert out.reward == [1.0] * 24
