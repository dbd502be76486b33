"""Classic `vf.ReasoningGymEnv`: a single-turn environment over reasoning-gym's generators.

    env = vf.ReasoningGymEnv("leg_counting", num_train_examples=100, num_eval_examples=20)

Rows are generated procedurally by the `reasoning_gym` package (imported only here, on first
use: a clear error names the package to install when it is missing); each row's `answer` is its
index in the generated dataset, which the reward function uses to score with reasoning-gym's own
`score_answer`.
"""

from __future__ import annotations

from typing import Any

from vfkit.compat.envs import SingleTurnEnv
from vfkit.errors import ConfigError
from vfkit.parsers.xml_parser import XMLParser
from vfkit.rubrics.rubric import Rubric

DEFAULT_SYSTEM_PROMPT = (
    "Think about the problem, then give only the final answer inside <answer></answer> tags."
)


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as e:
        raise ConfigError("ReasoningGymEnv needs the reasoning-gym package: "
                          "pip install reasoning-gym") from e
    return reasoning_gym


def build_rg_dataset(gym: str | list[str | dict[str, Any]], size: int, seed: int) -> Any:
    """One reasoning-gym dataset, or a composite of several (names or DatasetSpec dicts)."""
    rg = _reasoning_gym()
    if isinstance(gym, str):
        return rg.create_dataset(gym, size=size, seed=seed)
    from reasoning_gym.composite import DatasetSpec

    specs = []
    for item in gym:
        if isinstance(item, str):
            specs.append(DatasetSpec(name=item, weight=1.0, config={}))
        elif isinstance(item, dict):
            specs.append(DatasetSpec(**item))
        else:
            raise ConfigError(f"ReasoningGymEnv gym entries are names or dicts, not {item!r}")
    return rg.create_dataset("composite", datasets=specs, size=size, seed=seed)


class ReasoningGymEnv(SingleTurnEnv):
    """reasoning-gym tasks, the first `num_train_examples` for training, the rest for eval."""

    def __init__(self, gym: str | list[str | dict[str, Any]], num_train_examples: int = 1000,
                 num_eval_examples: int = 100, system_prompt: str | None = None,
                 parser: Any = None, seed: int = 0, **kwargs: Any) -> None:
        self.gym, self.seed = gym, seed
        self.num_train_examples, self.num_eval_examples = num_train_examples, num_eval_examples
        self.rg_dataset = build_rg_dataset(gym, num_train_examples + num_eval_examples, seed)
        rows = [{"question": x["question"], "answer": str(i),
                 "task": x["metadata"].get("source_dataset", "reasoning-gym")}
                for i, x in enumerate(self.rg_dataset)]
        parser = parser or XMLParser(["answer"])
        rubric = Rubric(parser=parser)
        rubric.add_reward_func(self.check_answer_reward_func)
        rubric.add_reward_func(parser.get_format_reward_func(), weight=0.0)
        if system_prompt is None:
            system_prompt = DEFAULT_SYSTEM_PROMPT
        super().__init__(dataset=rows[:num_train_examples], eval_dataset=rows[num_train_examples:]
                         or None, system_prompt=system_prompt, parser=parser, rubric=rubric,
                         **kwargs)

    def check_answer_reward_func(self, completion: Any, answer: str, **kwargs: Any) -> float:
        """reasoning-gym's score of the parsed answer against the row's generated entry."""
        entry = self.rg_dataset[int(answer)]
        response = self.parser.parse_answer(completion)
        return float(self.rg_dataset.score_answer(answer=str(response or "").strip(),
                                                  entry=entry))
