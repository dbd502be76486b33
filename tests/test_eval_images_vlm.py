"""End to end with a real image model: vf-eval runs shapes and zoom against the embedded server
(vf-serve) serving a tiny random LLaVA, writes the images into its results, and `vf-rl report`
shows them; a multi-turn rollout's image tokens stay consistent from turn to turn.

The model has random weights: the answers are noise, so rewards are not checked here (the
scripted-server tests check scoring); what is checked is that images go through the real
processor path and come back as token ids, results and thumbnails.
"""

from __future__ import annotations

import itertools
import json
import sys

import openai
import pytest
from test_eval_images import ENV_DIRS, SMALL, run_cli  # tests/ is on sys.path
from transformers import AutoTokenizer

import vfkit as vf
from vfkit.images import image_part, load_image, message_image_urls
from vfkit.serve.config import ServeConfig
from vfkit.serve.runner import BackgroundServer
from vfkit.testing.tiny_vlm import IMAGE_TOKEN, IMAGE_TOKENS_PER_IMAGE

sys.path.insert(0, str(ENV_DIRS[1]))
import vfkit_zoom as zoom  # after the path line above
from test_eval_cli import read_rows

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("env_id", ["shapes", "zoom"])
def test_vf_eval_runs_image_envs_on_the_embedded_server(env_id, vlm_path, tmp_path) -> None:
    out = tmp_path / "evals"
    # the tiny model's context is 1024 byte tokens: zoom's tool schema leaves no room for its
    # long default system prompt
    args = {**json.loads(SMALL), "system_prompt": "Zoom in, then answer."}
    proc = run_cli("vfkit.cli.eval", env_id, "-m", str(vlm_path), "-a", json.dumps(args), "-n", "2",
                   "-r", "2", "-t", "8", "-o", str(out), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (meta_path,) = out.glob("*/*/metadata.json")
    meta = json.loads(meta_path.read_text())
    assert meta["endpoint_source"] == "embedded" and meta["status"] == "completed"
    rows = read_rows(meta_path.parent)
    assert len(rows) == 4 and all(r["error"] is None for r in rows), rows[0]["error"]
    assert all(r["completion"][-1]["role"] == "assistant" for r in rows)
    for row in rows:
        (url,) = message_image_urls(row["prompt"])
        assert load_image(url).size == ((96, 96) if env_id == "shapes" else (128, 128))
    proc = run_cli("vfkit.cli.rl", "report", str(meta_path.parent), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (meta_path.parent / "report.html").read_text()
    assert page.count("<img class='thumb'") == 2  # one per distinct prompt (2 examples)


class ShowCrops(vf.MultiTurnEnv):
    """Answers every model turn with a zoom crop as an image: three turns of growing context."""

    def __init__(self, scenes: zoom.ZoomScenes, **kwargs) -> None:
        super().__init__(**kwargs)
        self.scenes = scenes

    def max_tokens_reached(self, state) -> bool:  # replaces the built-in stop: keep going
        return False

    async def env_response(self, messages, state):
        crop = self.scenes.crop(state["info"]["scene_seed"], 0, 0, 32, 32)
        return [{"role": "user", "content": [image_part(crop), {"type": "text", "text": "zoom"}]}]


async def test_image_tokens_stay_consistent_across_turns(vlm_path) -> None:
    scenes = zoom.ZoomScenes(512, 128, 128, 14, 2)
    env = ShowCrops(scenes, dataset=zoom.make_rows(2, 0, scenes), max_turns=3,
                    sampling_args={"max_tokens": 4})  # fmt: skip
    config = ServeConfig(str(vlm_path), served_model_name="vlm", dtype="float32", device="cpu",
                         threads=1)  # fmt: skip
    with BackgroundServer(config) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        state = await env.run_rollout(env.get_dataset()[0], client, "vlm")
    assert state["error"] is None and state["turn"] == 3
    image_id = AutoTokenizer.from_pretrained(vlm_path).convert_tokens_to_ids(IMAGE_TOKEN)
    steps = [step["tokens"] for step in state["trajectory"]]
    # turn k's prompt holds k images, each expanded by the processor to its placeholder tokens
    assert [t["prompt_ids"].count(image_id) for t in steps] == [
        IMAGE_TOKENS_PER_IMAGE * k for k in (1, 2, 3)]
    for prev, cur in itertools.pairwise(steps):
        # the earlier prompt, images included, is the exact start of the next one. (The whole
        # previous completion is not always: a random model may sample a lone UTF-8 byte that
        # the next turn's text round trip re-encodes; the scripted-server tests check that.)
        assert cur["prompt_ids"][: len(prev["prompt_ids"])] == prev["prompt_ids"]
    for t in steps:
        assert len(t["completion_ids"]) == len(t["completion_mask"]) == len(
            t["completion_logprobs"]) > 0
        assert set(t["prompt_mask"]) == {0} and set(t["completion_mask"]) == {1}
