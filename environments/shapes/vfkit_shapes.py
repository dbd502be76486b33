"""shapes: visual questions about coloured shapes drawn with PIL (single turn, one image).

Each scene puts 2-6 shapes (circle, square, triangle) in distinct cells of a 3x3 grid, each in
one of a few colours, on a white image of `image_size` pixels. One question per scene, of a kind
drawn from `kinds`:

    count_colour   How many red shapes are there?                      -> "2"
    count_shape    How many circles are there?                          -> "1"
    compare        Are there more red or blue shapes? (or "same")       -> "blue"
    colour_at      What colour is the shape in the top-left cell?       -> "green"

The model answers inside `<answer>` tags. Reward: `correct_answer` (1.0) = exact match of the
parsed answer (case and surrounding spaces ignored); `format_reward_func` (`format_weight`,
default 0) for a well-formed `<answer>` block, paid only with a correct answer so empty tags
earn nothing. Scenes come from a seeded RNG (no download); the eval set uses another seed and
no eval scene appears in the training set. The image reaches the prompt through vfkit's
`image` dataset column (an image part before the question).

    env = vf.load_environment("shapes", image_size=96, kinds=["count_colour"])
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from PIL import Image, ImageDraw

import vfkit as vf
from vfkit.bridge import v1_exports

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220),
           "yellow": (235, 200, 30)}  # fmt: skip
SHAPES = ("circle", "square", "triangle")
KINDS = ("count_colour", "count_shape", "compare", "colour_at")
GRID = 3
POSITIONS = {(0, 0): "top-left", (0, 1): "top", (0, 2): "top-right",
             (1, 0): "left", (1, 1): "center", (1, 2): "right",
             (2, 0): "bottom-left", (2, 1): "bottom", (2, 2): "bottom-right"}  # fmt: skip

SYSTEM_PROMPT = (
    "Look at the image and answer the question. Write only the answer (a number or a word) "
    "inside <answer></answer> tags."
)


@dataclass(frozen=True)
class Shape:
    kind: str  # circle | square | triangle
    colour: str
    cell: tuple[int, int]  # (row, column) in the 3x3 grid


def make_scene(rng: random.Random, min_shapes: int, max_shapes: int,
               colours: Sequence[str]) -> list[Shape]:  # fmt: skip
    """Shapes in distinct grid cells (seeded)."""
    cells = rng.sample(sorted(POSITIONS), rng.randint(min_shapes, max_shapes))
    return [Shape(rng.choice(SHAPES), rng.choice(list(colours)), cell) for cell in sorted(cells)]


def draw_scene(shapes: Sequence[Shape], size: int) -> Image.Image:
    """The scene as an RGB image `size` pixels square; each shape fills ~60% of its cell."""
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    cell = size / GRID
    for shape in shapes:
        cx, cy = (shape.cell[1] + 0.5) * cell, (shape.cell[0] + 0.5) * cell
        r = cell * 0.3
        box = (cx - r, cy - r, cx + r, cy + r)
        fill = COLOURS[shape.colour]
        if shape.kind == "circle":
            draw.ellipse(box, fill=fill)
        elif shape.kind == "square":
            draw.rectangle(box, fill=fill)
        else:
            draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=fill)
    return image


def ask(rng: random.Random, shapes: Sequence[Shape], kind: str,
        colours: Sequence[str]) -> tuple[str, str]:  # fmt: skip
    """(question, answer) of one `kind` about the scene."""
    if kind == "count_colour":
        colour = rng.choice(list(colours))
        n = sum(s.colour == colour for s in shapes)
        return f"How many {colour} shapes are there?", str(n)
    if kind == "count_shape":
        shape = rng.choice(SHAPES)
        n = sum(s.kind == shape for s in shapes)
        return f"How many {shape}s are there?", str(n)
    if kind == "compare":
        a, b = rng.sample(list(colours), 2)
        na, nb = (sum(s.colour == c for s in shapes) for c in (a, b))
        answer = a if na > nb else b if nb > na else "same"
        return (f"Are there more {a} shapes or more {b} shapes? Answer {a}, {b} or same.",
                answer)
    shape = rng.choice(list(shapes))
    return f"What colour is the shape in the {POSITIONS[shape.cell]} cell?", shape.colour


def make_rows(n: int, seed: int, *, image_size: int, kinds: Sequence[str],
              colours: Sequence[str], min_shapes: int, max_shapes: int,
              exclude: AbstractSet[tuple] = frozenset()) -> list[dict]:  # fmt: skip
    """n rows {question, answer, image, info} (seeded); scenes+questions in `exclude` skipped."""
    rng, rows, seen = random.Random(seed), [], set(exclude)
    for _ in range(n * 20):
        if len(rows) == n:
            break
        shapes = make_scene(rng, min_shapes, max_shapes, colours)
        question, answer = ask(rng, shapes, rng.choice(list(kinds)), colours)
        key = (tuple(shapes), question)
        if key in seen:
            continue
        seen.add(key)
        info = {"shapes": [{"shape": s.kind, "colour": s.colour, "row": s.cell[0],
                            "col": s.cell[1]} for s in shapes]}
        rows.append({"question": question, "answer": answer,
                     "image": draw_scene(shapes, image_size), "info": info})
    return rows


def scene_keys(rows: Sequence[dict]) -> set[tuple]:
    return {(tuple(Shape(s["shape"], s["colour"], (s["row"], s["col"]))
                   for s in row["info"]["shapes"]), row["question"]) for row in rows}


def normalize(text: str | None) -> str:
    return " ".join((text or "").strip().lower().rstrip(".").split())


def _check_args(image_size: int, kinds: Sequence[str], colours: Sequence[str],
                min_shapes: int, max_shapes: int) -> None:  # fmt: skip
    if not 24 <= image_size <= 1024:
        raise ValueError(f"image_size must be in 24..1024 pixels, got {image_size}")
    bad = sorted(set(kinds) - set(KINDS))
    if bad or not kinds:
        raise ValueError(f"kinds {bad or list(kinds)} unknown or empty; choose from {list(KINDS)}")
    bad = sorted(set(colours) - set(COLOURS))
    if bad or len(set(colours)) < 2:
        raise ValueError(f"colours must be two or more of {list(COLOURS)}, got {list(colours)}")
    if not 1 <= min_shapes <= max_shapes <= len(POSITIONS):
        raise ValueError(f"need 1 <= min_shapes <= max_shapes <= {len(POSITIONS)}, "
                         f"got {min_shapes}, {max_shapes}")


def load_environment(
    num_train_examples: int = 1000,
    num_eval_examples: int = 100,
    image_size: int = 96,
    kinds: Sequence[str] = KINDS,
    colours: Sequence[str] = tuple(COLOURS),
    min_shapes: int = 2,
    max_shapes: int = 6,
    seed: int = 0,
    format_weight: float = 0.0,
    max_tokens: int = 32,
    system_prompt: str = SYSTEM_PROMPT,
) -> vf.Environment:
    """Build the environment; `kinds`, `colours` and the shape counts set the difficulty."""
    _check_args(image_size, kinds, colours, min_shapes, max_shapes)
    shape_args = {"image_size": image_size, "kinds": list(kinds), "colours": list(colours),
                  "min_shapes": min_shapes, "max_shapes": max_shapes}
    eval_rows = make_rows(num_eval_examples, seed + 1, **shape_args)
    train_rows = make_rows(num_train_examples, seed, exclude=scene_keys(eval_rows), **shape_args)
    parser = vf.XMLParser(["answer"])

    def correct_answer(completion, answer: str) -> float:
        """1.0 when the <answer> equals the expected answer (case and spaces ignored)."""
        return float(normalize(parser.parse_answer(completion)) == normalize(answer))

    tags_reward = parser.get_format_reward_func()

    def format_reward_func(completion, answer: str) -> float:
        """Format credit for the <answer> block, only around a correct answer."""
        return tags_reward(completion=completion) if correct_answer(completion, answer) else 0.0

    rubric = vf.Rubric(funcs=[correct_answer, format_reward_func],
                       weights=[1.0, format_weight], parser=parser)
    return vf.SingleTurnEnv(dataset=train_rows, eval_dataset=eval_rows,
                            system_prompt=system_prompt, parser=parser, rubric=rubric,
                            sampling_args={"max_tokens": max_tokens}, env_id="shapes")


# verifiers v1 / prime-rl: `vf.load_taskset("vfkit-shapes")` (needs vfkit[verifiers])
__all__, __getattr__ = v1_exports("shapes", load_environment)
