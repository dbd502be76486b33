"""`vf-rl report`: images in a training run's saved rollouts become small embedded thumbnails."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

from PIL import Image

from vfkit.images import image_part
from vfkit.launch.report import THUMB_PX, write_report
from vfkit.launch.report_html import THUMBS_PER_ROLLOUT
from vfkit.train.rundir import RunDir


def picture(size: int, colour: tuple[int, int, int]) -> Image.Image:
    return Image.new("RGB", (size, size), colour)


def thumbs(page: str) -> list[Image.Image]:
    """The thumbnails embedded in a page, decoded."""
    urls = re.findall(r"<img class='thumb' alt='image' src='data:image/jpeg;base64,([^']+)'", page)
    return [Image.open(io.BytesIO(base64.b64decode(u))) for u in urls]


def write_run(root: Path, completion_images: int) -> RunDir:
    """A run folder as the trainer writes it: rollouts/step_1.jsonl with image messages."""
    run = RunDir(root)
    run.rollouts.mkdir(parents=True)
    run.metrics.write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    prompt = [{"role": "system", "content": "Look."},
              {"role": "user", "content": [image_part(picture(400, (255, 0, 0))),
                                           {"type": "text", "text": "What colour?"}]}]  # fmt: skip
    tool_parts = [{"type": "text", "text": "crop:"}]
    tool_parts += [image_part(picture(64, (0, 0, 255))) for _ in range(completion_images)]
    completion = [{"role": "assistant", "content": "", "tool_calls": [
                      {"id": "c", "type": "function",
                       "function": {"name": "zoom", "arguments": "{}"}}]},
                  {"role": "tool", "content": tool_parts, "tool_call_id": "c"},
                  {"role": "assistant", "content": "<answer>red</answer>"}]  # fmt: skip
    record = {"prompt": prompt, "completion": completion, "reward": 1.0, "answer": "red",
              "metrics": {"correct": 1.0}, "group": 0, "policy_version": 0}  # fmt: skip
    (run.rollouts / "step_1.jsonl").write_text(json.dumps(record) + "\n")
    return run


def test_training_rollouts_show_downscaled_thumbnails(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", completion_images=1)
    page = write_report(run).read_text()
    shown = thumbs(page)
    assert len(shown) == 2  # the prompt's image and the tool's crop
    assert shown[0].size == (THUMB_PX, THUMB_PX)  # 400 px shrunk to the thumbnail size
    assert shown[1].size == (64, 64)  # smaller images are not enlarged
    assert shown[0].convert("RGB").getpixel((5, 5))[0] > 200  # still red
    assert "base64" not in page.replace("data:image/jpeg;base64,", "")  # no original bytes
    assert "What colour?" in page and "crop:" in page  # the text parts as text


def test_thumbnails_per_rollout_are_capped_and_paths_are_never_read(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", completion_images=THUMBS_PER_ROLLOUT + 3)
    page = write_report(run).read_text()
    assert len(thumbs(page)) == THUMBS_PER_ROLLOUT  # 1 prompt image + 5 of the 9 crops
    assert "[4 more image(s)]" in page
    secret = tmp_path / "secret.png"
    picture(8, (0, 255, 0)).save(secret)
    record = json.loads((run.rollouts / "step_1.jsonl").read_text())
    record["prompt"][-1]["content"][0] = {"type": "image_url", "image_url": {"url": str(secret)}}
    (run.rollouts / "step_1.jsonl").write_text(json.dumps(record) + "\n")
    page = write_report(run).read_text()
    assert "[image not shown:" in page and "not a data URL" in page
