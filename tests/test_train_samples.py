"""States -> training samples from the server's token ids: merging turns, masks, drops."""

from __future__ import annotations

from vfkit.train.samples import build_samples, nothing_to_train, rollout_samples


def step(prompt, completion, logprobs=None, truncated=False, mask=None):
    return {"tokens": {
        "prompt_ids": prompt, "prompt_mask": [0] * len(prompt), "completion_ids": completion,
        "completion_mask": mask or [1] * len(completion),
        "completion_logprobs": logprobs or [-0.1] * len(completion),
        "overlong_prompt": False, "is_truncated": truncated,
    }}


def test_turns_that_extend_each_other_make_one_sequence() -> None:
    state = {"advantage": 0.5, "trajectory": [
        step([1, 2], [3, 4], [-0.3, -0.4]),
        step([1, 2, 3, 4, 9, 9], [5], [-0.5]),  # 9 9 = tool/env tokens between turns
    ]}
    (sample,) = rollout_samples(state)
    assert sample.input_ids == [1, 2, 3, 4, 9, 9, 5]
    assert sample.loss_mask == [0, 0, 1, 1, 0, 0, 1]
    assert sample.sampling_logprobs == [0.0, 0.0, -0.3, -0.4, 0.0, 0.0, -0.5]
    assert sample.advantage == 0.5


def test_turns_that_do_not_extend_are_separate_sequences() -> None:
    state = {"advantage": 1.0, "trajectory": [step([1, 2], [3]), step([7, 8], [4])]}
    samples = rollout_samples(state)
    assert [s.input_ids for s in samples] == [[1, 2, 3], [7, 8, 4]]


def test_server_completion_mask_is_kept() -> None:
    (sample,) = rollout_samples({"trajectory": [step([1], [2, 3], mask=[1, 0])]})
    assert sample.loss_mask == [0, 1, 0]


def test_build_samples_drops_and_counts() -> None:
    ok = {"advantage": 1.0, "trajectory": [step([1], [2])]}
    failed = {"error": "boom", "trajectory": [step([1], [2])]}
    no_ids = {"trajectory": [{"tokens": None}]}
    truncated = {"is_truncated": True, "trajectory": [step([1], [2], truncated=True)]}
    too_long = {"trajectory": [step([1] * 10, [2])]}
    samples, counts = build_samples(
        [[ok, failed, no_ids, truncated, too_long]], max_seq_len=5, mask_truncated=True
    )
    assert [s.input_ids for s in samples] == [[1, 2]]
    assert (counts.errors, counts.no_tokens, counts.truncated_masked, counts.too_long) == (
        1, 1, 1, 1)
    samples, _ = build_samples([[truncated]], max_seq_len=5, mask_truncated=False)
    assert len(samples) == 1 and samples[0].is_truncated


def test_a_batch_with_nothing_to_train_says_what_to_fix() -> None:
    """Every rollout failed: the advice follows the failure (it always said max_tokens)."""
    def failed(error: str) -> list[list[dict]]:
        return [[{"error": error, "trajectory": []} for _ in range(2)]]

    rubric = nothing_to_train(failed("reward function grp raised ValueError: bad"))
    server = nothing_to_train(failed("InternalServerError: Error code: 503 - overloaded"))
    short = nothing_to_train([[{"stop_condition": "prompt_too_long", "trajectory": []}]])
    assert "2 error" in rubric and "fix the environment's reward function" in rubric
    assert "503" in server and "logs/server.log" in server and "max_tokens" not in server
    assert "1 prompt_too_long" in short and "trainer.args.max_tokens" in short
