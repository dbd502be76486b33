"""Group-relative advantages, error exclusion, truncation zeroing, zero-advantage filtering."""

from __future__ import annotations

import pytest

from vfkit.advantage import group_advantages
from vfkit.train.advantages import assign_advantages


def test_group_mean_baseline_and_std_scaling() -> None:
    assert group_advantages([1.0, 0.0], "none") == [0.5, -0.5]  # mean 0.5
    # std of [1, 0] is 0.5: 0.5 / (0.5 + 1e-4) ~= 0.9998
    assert group_advantages([1.0, 0.0], "group") == pytest.approx([0.9998, -0.9998], abs=1e-4)


def test_failed_rollouts_are_excluded_from_the_baseline() -> None:
    group = [{"reward": 1.0}, {"reward": 0.0}, {"reward": 0.0, "error": "RolloutError: boom"}]
    kept, counts = assign_advantages(
        [group], scale_rewards="none", zero_truncated=False, filter_zero=True
    )
    # mean over the two good rollouts = 0.5; the failed one gets no advantage
    assert [s["advantage"] for s in group] == [0.5, -0.5, 0.0]
    assert kept == [group] and counts.kept == 1


def test_zero_advantage_groups_filtered_and_counted() -> None:
    flat = [{"reward": 0.3}, {"reward": 0.3}]
    moving = [{"reward": 1.0}, {"reward": 0.0}]
    failed = [{"reward": 0.0, "error": "x"}, {"reward": 0.0, "error": "y"}]
    kept, counts = assign_advantages(
        [flat, moving, failed], scale_rewards="group", zero_truncated=False, filter_zero=True
    )
    assert kept == [moving]
    assert (counts.kept, counts.filtered, counts.failed) == (1, 1, 1)
    kept, _ = assign_advantages(
        [flat, moving], scale_rewards="group", zero_truncated=False, filter_zero=False
    )
    assert kept == [flat, moving]


def test_zero_truncated_scores_truncated_rollouts_zero() -> None:
    group = [{"reward": 1.0, "is_truncated": True}, {"reward": 0.5}]
    assign_advantages([group], scale_rewards="none", zero_truncated=True, filter_zero=False)
    assert [s["advantage"] for s in group] == [-0.25, 0.25]  # rewards (0, 0.5), mean 0.25


async def test_env_and_trainer_share_one_advantage() -> None:
    """The env's scoring and the trainer's batch agree, per-turn copies included."""
    import vfkit as vf
    from vfkit.testing.scripted_server import TestServer

    def exact(completion, answer) -> float:
        return 1.0 if completion[-1]["content"] == answer else 0.0

    env = vf.SingleTurnEnv(dataset=[{"question": "q", "answer": "yes"}],
                           rubric=vf.Rubric(funcs=[exact]))
    with TestServer(["yes", "no", "no"]) as server:
        group = await env.run_group([{"question": "q", "answer": "yes"}] * 3,
                                    server.client(), "m")
    rewards = [s["reward"] for s in group]  # replies reach concurrent rollouts in any order
    assert sorted(rewards) == [0.0, 0.0, 1.0]
    # the env's scoring: reward minus the mean of 1, 0, 0 = 1/3
    assert [s["advantage"] for s in group] == pytest.approx([r - 1 / 3 for r in rewards])
    failed = next(s for s in group if s["reward"] == 0.0)
    failed["error"] = "RolloutError: the server went away"  # a failure after scoring
    assign_advantages([group], scale_rewards="none", zero_truncated=False, filter_zero=False)
    # the failed rollout leaves the baseline: mean of (1, 0) = 0.5
    expected = [0.0 if s is failed else s["reward"] - 0.5 for s in group]
    assert [s["advantage"] for s in group] == expected
    for state in group:  # the trajectory's per-turn copies follow the state's advantage
        assert all(step["advantage"] == state["advantage"] for step in state["trajectory"])
