"""zoom: read a tiny digit in a large image with a zoom tool (multi-turn, images in tool results).

In the spirit of Pixel-Reasoner's pixel-space tools. A scene is a `canvas_size` px image with
coloured distractor shapes and one small white tag holding a digit a few pixels tall. The model
sees the scene shrunk to `view_size` px, where the tag is a pale dot and its digit unreadable,
and may call

    zoom(x1, y1, x2, y2)     # a rectangle in pixels of the image it was shown

which answers with that region cut from the full-resolution canvas and enlarged to `zoom_size`
px: an image in the tool message, seen by the model in its next turn. Coordinates that are out
of range or empty come back as a tool error text naming the problem; the rollout goes on.
The answer is the digit inside `<answer>` tags.

Rewards: `correct_answer` (1.0); `format_reward_func` (`format_weight`, default 0; only with a
correct answer); tool-use metrics (`total_tool_calls`, `zoom_calls`, weight 0); and the
curiosity terms of `vfkit.rubrics.curiosity.CuriosityRubric`, off by default (weights 0, still
recorded as metrics): `curiosity_weight` (alpha) pays `max(curiosity_threshold - group zoom
rate, 0)` to each rollout that zooms, `overuse_weight` (beta) charges each zoom beyond
`max_free_zooms`. Pixel-Reasoner used alpha=0.5, H=0.3, beta=0.05, N=1.

    env = vf.load_environment("zoom", curiosity_weight=0.5, overuse_weight=0.05)
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

from PIL import Image, ImageDraw

import vfkit as vf
from vfkit.bridge import v1_exports
from vfkit.rubrics.curiosity import CuriosityRubric

# 3x5 pixel glyphs ("#" = ink): identical on every platform, no font file needed.
GLYPHS = {
    "0": ("###", "#.#", "#.#", "#.#", "###"), "1": (".#.", "##.", ".#.", ".#.", "###"),
    "2": ("###", "..#", "###", "#..", "###"), "3": ("###", "..#", "###", "..#", "###"),
    "4": ("#.#", "#.#", "###", "..#", "..#"), "5": ("###", "#..", "###", "..#", "###"),
    "6": ("###", "#..", "###", "#.#", "###"), "7": ("###", "..#", "..#", ".#.", ".#."),
    "8": ("###", "#.#", "###", "#.#", "###"), "9": ("###", "#.#", "###", "..#", "###"),
}  # fmt: skip
PALETTE = [(220, 40, 40), (40, 170, 60), (40, 80, 220), (235, 200, 30), (150, 60, 200),
           (240, 130, 20), (30, 170, 190)]  # fmt: skip
BACKGROUND = (90, 90, 90)
SYSTEM_PROMPT = (
    "A tiny digit is written on a small white tag somewhere in the image; it is too small to "
    "read at this size. Call zoom(x1, y1, x2, y2) with a rectangle in pixels of the image to "
    "see that region enlarged. When you can read the digit, answer with it inside "
    "<answer></answer> tags."
)


@lru_cache(maxsize=64)
def render_scene(seed: int, canvas_size: int, num_distractors: int, pixel: int
                 ) -> tuple[Image.Image, str, tuple[int, int, int, int]]:  # fmt: skip
    """(canvas, digit, tag box on the canvas) of scene `seed`; `pixel` = glyph pixel size."""
    rng = random.Random(seed)
    image = Image.new("RGB", (canvas_size, canvas_size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for _ in range(num_distractors):
        w, h = (rng.randint(canvas_size // 16, canvas_size // 5) for _ in range(2))
        x, y = rng.randint(0, canvas_size - w), rng.randint(0, canvas_size - h)
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((x, y, x + w, y + h), fill=rng.choice(PALETTE))
    digit = rng.choice(sorted(GLYPHS))
    tag_w, tag_h = 5 * pixel, 7 * pixel  # the glyph (3x5) and one glyph pixel of margin
    x0, y0 = rng.randint(0, canvas_size - tag_w), rng.randint(0, canvas_size - tag_h)
    draw.rectangle((x0, y0, x0 + tag_w - 1, y0 + tag_h - 1), fill="white")
    for r, row in enumerate(GLYPHS[digit]):
        for c, ink in enumerate(row):
            if ink == "#":
                px, py = x0 + (c + 1) * pixel, y0 + (r + 1) * pixel
                draw.rectangle((px, py, px + pixel - 1, py + pixel - 1), fill="black")
    return image, digit, (x0, y0, x0 + tag_w, y0 + tag_h)


class ZoomScenes:
    """Scene parameters and the zoom tool's geometry (view pixels <-> canvas pixels)."""

    def __init__(self, canvas_size: int, view_size: int, zoom_size: int, num_distractors: int,
                 glyph_pixel: int) -> None:  # fmt: skip
        if not 16 <= view_size <= canvas_size:
            raise ValueError(f"need 16 <= view_size <= canvas_size, got {view_size}, "
                             f"{canvas_size}")
        if not 16 <= zoom_size <= 1024 or glyph_pixel < 1 or 7 * glyph_pixel > canvas_size:
            raise ValueError(f"zoom_size must be 16..1024 (got {zoom_size}) and the tag "
                             f"(7 * glyph_pixel = {7 * glyph_pixel}) must fit the canvas")
        self.canvas_size, self.view_size, self.zoom_size = canvas_size, view_size, zoom_size
        self.num_distractors, self.glyph_pixel = num_distractors, glyph_pixel

    def scene(self, seed: int) -> tuple[Image.Image, str, tuple[int, int, int, int]]:
        return render_scene(seed, self.canvas_size, self.num_distractors, self.glyph_pixel)

    def view(self, seed: int) -> Image.Image:
        """What the prompt shows: the canvas shrunk to view_size."""
        canvas, _, _ = self.scene(seed)
        return canvas.resize((self.view_size, self.view_size), Image.Resampling.BOX)

    def check_box(self, x1: float, y1: float, x2: float, y2: float) -> None:
        """ValueError naming what is wrong with a zoom rectangle (view pixels)."""
        v = self.view_size
        where = f"zoom({x1}, {y1}, {x2}, {y2})"
        if any(not 0 <= c <= v for c in (x1, y1, x2, y2)):
            raise ValueError(f"{where}: coordinates must lie in 0..{v} (the image is {v}x{v} "
                             "pixels)")
        if x2 - x1 < 2 or y2 - y1 < 2:
            raise ValueError(f"{where}: need x1 < x2 and y1 < y2, at least 2 pixels apart "
                             "(x1, y1 is the top-left corner, x2, y2 the bottom-right one)")

    def crop(self, seed: int, x1: float, y1: float, x2: float, y2: float) -> Image.Image:
        """The rectangle (view pixels) cut from the full canvas, longer side zoom_size px."""
        self.check_box(x1, y1, x2, y2)
        canvas, _, _ = self.scene(seed)
        s = self.canvas_size / self.view_size
        box = tuple(round(c * s) for c in (x1, y1, x2, y2))
        region = canvas.crop(box)
        scale = self.zoom_size / max(region.size)
        size = (max(1, round(region.width * scale)), max(1, round(region.height * scale)))
        return region.resize(size, Image.Resampling.NEAREST)

    def tag_in_view(self, seed: int) -> list[int]:
        """The tag's rectangle in view pixels (rounded outwards)."""
        _, _, box = self.scene(seed)
        s = self.view_size / self.canvas_size
        x0, y0, x1, y1 = box
        return [int(x0 * s), int(y0 * s), min(self.view_size, int(x1 * s) + 1),
                min(self.view_size, int(y1 * s) + 1)]


class ZoomEnv(vf.StatefulToolEnv):
    """A StatefulToolEnv whose `zoom` tool gets the rollout's scene seed as a hidden argument."""

    def __init__(self, scenes: ZoomScenes, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenes = scenes

        def zoom(x1: float, y1: float, x2: float, y2: float, scene_seed: int) -> list:
            """Zoom into a rectangle of the image and see it enlarged.

            Args:
                x1: Left edge, in pixels of the image you were shown.
                y1: Top edge, in pixels.
                x2: Right edge, in pixels (greater than x1).
                y2: Bottom edge, in pixels (greater than y1).
            """
            crop = scenes.crop(scene_seed, x1, y1, x2, y2)
            return [{"type": "text", "text": f"zoom({x1}, {y1}, {x2}, {y2}):"}, crop]

        self.add_tool(zoom, args_to_skip=["scene_seed"])

    def update_tool_args(self, tool_name: str, tool_args: dict[str, Any], messages: Any,
                         state: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        return {**tool_args, "scene_seed": int(state["info"]["scene_seed"])}


def make_rows(n: int, seed: int, scenes: ZoomScenes) -> list[dict]:
    """n rows {question, answer, image, info} from scene seeds drawn with `seed`."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        scene_seed = rng.randrange(2**31)
        _, digit, _ = scenes.scene(scene_seed)
        v = scenes.view_size
        rows.append({
            "question": f"The image is {v}x{v} pixels. What is the digit on the white tag?",
            "answer": digit,
            "image": scenes.view(scene_seed),
            "info": {"scene_seed": scene_seed, "tag_box": scenes.tag_in_view(scene_seed)},
        })
    return rows


def load_environment(
    num_train_examples: int = 500,
    num_eval_examples: int = 50,
    canvas_size: int = 512,
    view_size: int = 128,
    zoom_size: int = 128,
    num_distractors: int = 14,
    glyph_pixel: int = 2,
    seed: int = 0,
    max_turns: int = 4,
    max_tokens: int = 96,
    format_weight: float = 0.0,
    curiosity_weight: float = 0.0,
    curiosity_threshold: float = 0.3,
    overuse_weight: float = 0.0,
    max_free_zooms: int = 1,
    tool_images: str = "tool",
    system_prompt: str = SYSTEM_PROMPT,
) -> vf.Environment:
    """Build the environment; see the module doc for the arguments' meaning."""
    scenes = ZoomScenes(canvas_size, view_size, zoom_size, num_distractors, glyph_pixel)
    eval_rows = make_rows(num_eval_examples, seed + 1, scenes)
    held_out = {r["info"]["scene_seed"] for r in eval_rows}
    train_rows = [r for r in make_rows(num_train_examples + len(held_out), seed, scenes)
                  if r["info"]["scene_seed"] not in held_out][:num_train_examples]
    parser = vf.XMLParser(["answer"])

    def correct_answer(completion, answer: str) -> float:
        """1.0 when the <answer> is the digit on the tag."""
        return float((parser.parse_answer(completion) or "").strip() == answer)

    tags_reward = parser.get_format_reward_func()

    def format_reward_func(completion, answer: str) -> float:
        """Format credit for the <answer> block, only around a correct answer."""
        return tags_reward(completion=completion) if correct_answer(completion, answer) else 0.0

    rubric = vf.RubricGroup([
        vf.Rubric(funcs=[correct_answer, format_reward_func], weights=[1.0, format_weight],
                  parser=parser),
        vf.ToolRubric(tools=["zoom"]),
        CuriosityRubric(["zoom"], bonus_weight=curiosity_weight,
                        rate_threshold=curiosity_threshold, penalty_weight=overuse_weight,
                        max_free_calls=max_free_zooms),
    ])
    return ZoomEnv(scenes, dataset=train_rows, eval_dataset=eval_rows, max_turns=max_turns,
                   system_prompt=system_prompt, parser=parser, rubric=rubric,
                   tool_images=tool_images, sampling_args={"max_tokens": max_tokens},
                   env_id="zoom")


# verifiers v1 / prime-rl: `vf.load_taskset("vfkit-zoom")` (needs vfkit[verifiers])
__all__, __getattr__ = v1_exports("zoom", load_environment)
