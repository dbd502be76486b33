"""A `seed` in the sampling args: each group of a call draws its own stream, each rollout of a
group its own seed (seed + k), and a rerun, or a resumed eval given only the missing rows,
sends every group the seeds it had."""

from __future__ import annotations

import pytest

from vfkit.envs.singleturn_env import SingleTurnEnv
from vfkit.testing.scripted_server import TestServer

ROWS = [{"question": f"q{i}", "answer": str(i)} for i in range(3)]


def _seeds_by_prompt(bodies: list[dict]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for body in bodies:
        out.setdefault(body["messages"][-1]["content"], []).append(body["seed"])
    return {k: sorted(v) for k, v in out.items()}


async def test_generate_seeds_groups_apart_and_repeats_them_for_any_subset() -> None:
    env = SingleTurnEnv(dataset=ROWS)
    rows = list(env.get_dataset())
    with TestServer(lambda body: "ok") as srv:
        await env.generate(rows, srv.client(), "m", {"seed": 7}, rollouts_per_example=3)
        full = _seeds_by_prompt(srv.requests)
        srv.requests.clear()
        await env.generate(rows[1:2], srv.client(), "m", {"seed": 7}, rollouts_per_example=3)
        subset = _seeds_by_prompt(srv.requests)
        srv.requests.clear()
        await env.generate(rows, srv.client(), "m", {"seed": 8}, rollouts_per_example=3)
        other = _seeds_by_prompt(srv.requests)
    assert sorted(full) == ["q0", "q1", "q2"]
    for seeds in full.values():  # rollout k of a group: the group's seed + k
        assert seeds == [seeds[0], seeds[0] + 1, seeds[0] + 2]
    assert len({s for seeds in full.values() for s in seeds}) == 9  # no stream shared
    assert subset == {"q1": full["q1"]}  # a resumed eval's rows get the seeds they had
    assert not {s for v in other.values() for s in v} & {s for v in full.values() for s in v}


async def test_the_environments_own_seed_seeds_it_and_no_seed_sends_none() -> None:
    seeded = SingleTurnEnv(dataset=ROWS[:2], sampling_args={"seed": 3})
    plain = SingleTurnEnv(dataset=ROWS[:2])
    with TestServer(lambda body: "ok") as srv:
        await seeded.generate(seeded.get_dataset(), srv.client(), "m", rollouts_per_example=2)
        assert len({b["seed"] for b in srv.requests}) == 4
        srv.requests.clear()
        await plain.generate(plain.get_dataset(), srv.client(), "m", rollouts_per_example=2)
        assert all("seed" not in b for b in srv.requests)


async def test_a_seeded_group_gives_rollout_k_seed_plus_k_and_records_it() -> None:
    env = SingleTurnEnv(dataset=ROWS)
    with TestServer(lambda body: "ok") as srv:
        states = await env.run_group([dict(env.get_dataset()[0])] * 4, srv.client(), "m",
                                     {"seed": 100})
        sent = sorted(b["seed"] for b in srv.requests)
    assert sent == [100, 101, 102, 103]  # before: every rollout 100, four equal completions
    assert [s["sampling_args"]["seed"] for s in states] == [100, 101, 102, 103]


async def test_rollout_indices_give_a_partial_group_the_seeds_it_had() -> None:
    """A resumed eval runs only a group's missing rollouts: rollout k keeps seed + k."""
    import vfkit.compat.verifiers as classic

    env = SingleTurnEnv(dataset=ROWS)
    with TestServer(lambda body: "ok") as srv:
        states = await env.run_group([dict(env.get_dataset()[0])] * 2, srv.client(), "m",
                                     {"seed": 100}, rollout_indices=[2, 5])
        assert sorted(b["seed"] for b in srv.requests) == [102, 105]
        assert [s["sampling_args"]["seed"] for s in states] == [102, 105]
        rows = list(env.get_dataset())
        await env.generate(rows, srv.client(), "m", {"seed": 7}, rollouts_per_example=3)
        full = _seeds_by_prompt(srv.requests[2:])
        for vf in (env, classic.SingleTurnEnv(dataset=ROWS)):  # vfkit's generate and classic
            srv.requests.clear()
            await vf.generate(rows[1:], srv.client(), "m", {"seed": 7}, rollouts_per_example=1,
                              rollout_indices={rows[1]["example_id"]: [2],
                                               rows[2]["example_id"]: [0]})
            assert _seeds_by_prompt(srv.requests) == {"q1": full["q1"][2:], "q2": full["q2"][:1]}
        with pytest.raises(ValueError, match="rollout_indices"):
            await env.run_group([dict(rows[0])] * 2, srv.client(), "m", rollout_indices=[0])
