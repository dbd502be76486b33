"""reverse-text: reverse a short text character by character (single turn).

Reward: `reversal_reward` = how much closer the parsed `<answer>` is to the reversed text than an
echo of the input would be: the difflib LCS ratio to the reversed text, minus the ratio the
unreversed input gets, rescaled so an echo (or anything no better) scores 0 and an exact reversal
1.0. Partly right reversals keep partial credit; copying the input earns nothing (a plain LCS
ratio paid `stone` 0.2 for `enots`, and small models learned to echo). Plus a format reward
(weight 0.2) for one well-formed `<answer>` block. Without tags the whole reply is compared
(`strict_format=True`: it scores 0), so a small model that has not learned the tags yet still
gets a signal for reversing. Texts are made from a seeded word list, so no download
is needed and train / eval sets never overlap (different seeds, eval texts removed from train).

    env = vf.load_environment("reverse-text", max_words=2)
"""

from __future__ import annotations

import random
import re
from difflib import SequenceMatcher

import vfkit as vf
from vfkit.bridge import v1_exports

_WORD_TEXT = """
apple river candle orbit maple violet harbor pixel garden silver window rocket pepper forest
summer winter yellow purple orange planet butter coffee basket bridge castle dragon engine
falcon guitar hammer island jacket kitten ladder magnet needle oyster parrot quartz rabbit
saddle tablet velvet walnut zipper anchor bottle carpet desert eagle feather glacier helmet
lemon mirror nickel onion pencil puzzle rain salt tiger tomato umbrella valley wagon cloud
stone bread chair table green happy quiet brave small large quick slow early later north south
east west paper music light night dream ocean storm sugar honey cat dog sun moon star tree
fish bird book door lamp milk rice road ship snow wind wolf bear frog duck seed leaf rock sand
"""
WORDS = _WORD_TEXT.split()

SYSTEM_PROMPT = (
    "Reverse the given text character by character. "
    "Write only the reversed text inside <answer></answer> tags."
)


def make_texts(n: int, seed: int, min_words: int, max_words: int) -> list[str]:
    """n texts of min_words..max_words random words (seeded)."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(min_words, max_words))) for _ in range(n)]


def make_rows(texts: list[str]) -> list[dict]:
    return [{"question": f"Reverse this text: {t}", "answer": t[::-1], "info": {"text": t}}
            for t in texts]


def lcs_ratio(response: str, target: str) -> float:
    """Similarity in [0, 1]: 2 * matched characters / total characters (difflib)."""
    return SequenceMatcher(None, response, target, autojunk=False).ratio()


def reversal_score(response: str, target: str) -> float:
    """LCS credit above the echo level, in [0, 1]: 0 for the unreversed input, 1 for `target`.

    (ratio(response) - ratio(echo)) / (1 - ratio(echo)), clipped; `target[::-1]` is the echo.
    A palindrome's echo is the right answer, so there only the plain ratio is left.
    """
    echo_ratio = lcs_ratio(target[::-1], target)
    if echo_ratio >= 1.0:
        return lcs_ratio(response, target)
    gain = (lcs_ratio(response, target) - echo_ratio) / (1.0 - echo_ratio)
    return min(1.0, max(0.0, gain))


def answer_text(parser: vf.XMLParser, completion, strict: bool) -> str | None:
    """The <answer> content; without tags, the reply itself (None when strict)."""
    answer = parser.parse_answer(completion)
    if answer is not None or strict:
        return answer
    text = vf.Parser().parse_answer(completion) or ""  # the last reply's text
    return re.sub(r"</?answer>", "", text).strip()


def check_text_supply(wanted: int, min_words: int, max_words: int) -> None:
    """ValueError naming max_words when fewer distinct texts exist than train + eval ask for
    (max_words=1 allows one per word: the train set shrank silently, the eval set repeated)."""
    distinct = sum(len(WORDS) ** k for k in range(min_words, max_words + 1))
    if distinct < wanted:
        raise ValueError(
            f"reverse-text: min_words={min_words}, max_words={max_words} allow only {distinct} "
            f"distinct texts, fewer than num_train_examples + num_eval_examples = {wanted}; "
            "raise max_words, or ask for fewer examples"
        )


def load_environment(
    num_train_examples: int = 2000,
    num_eval_examples: int = 200,
    min_words: int = 1,
    max_words: int = 2,
    seed: int = 0,
    format_weight: float = 0.2,
    strict_format: bool = False,
    max_tokens: int = 48,
    system_prompt: str = SYSTEM_PROMPT,
) -> vf.Environment:
    """Build the environment; the text length (in words) sets the difficulty."""
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    check_text_supply(num_train_examples + num_eval_examples, min_words, max_words)
    eval_texts = make_texts(num_eval_examples, seed + 1, min_words, max_words)
    held_out = set(eval_texts)
    train_texts = [t for t in make_texts(num_train_examples * 2, seed, min_words, max_words)
                   if t not in held_out][:num_train_examples]
    if len(train_texts) < num_train_examples:  # the held-out eval texts took most of them
        raise ValueError(
            f"reverse-text: only {len(train_texts)} training texts of {min_words}..{max_words} "
            f"words are not eval texts (num_train_examples={num_train_examples}); raise "
            "max_words, or ask for fewer examples"
        )
    parser = vf.XMLParser(["answer"])

    def reversal_reward(completion, answer: str) -> float:
        """LCS credit above the echo level (0 without an answer); see `reversal_score`."""
        response = answer_text(parser, completion, strict_format)
        return reversal_score(response, answer) if response else 0.0

    tags_reward = parser.get_format_reward_func()

    def format_reward_func(completion, answer: str) -> float:
        """The tags' format credit, only around an answer that earns reversal credit: empty
        tags or an echo in perfect tags earn nothing (the cheapest signal to game otherwise)."""
        return tags_reward(completion=completion) if reversal_reward(completion, answer) else 0.0

    rubric = vf.Rubric(funcs=[reversal_reward, format_reward_func],
                       weights=[1.0, format_weight], parser=parser)
    return vf.SingleTurnEnv(dataset=make_rows(train_texts), eval_dataset=make_rows(eval_texts),
                            system_prompt=system_prompt, parser=parser, rubric=rubric,
                            sampling_args={"max_tokens": max_tokens}, env_id="reverse-text")


# verifiers v1 / prime-rl: `vf.load_taskset("vfkit-reverse-text")` (needs vfkit[verifiers])
__all__, __getattr__ = v1_exports("reverse-text", load_environment)
