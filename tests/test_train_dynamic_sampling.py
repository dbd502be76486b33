"""Dynamic sampling: flat groups (every reward equal) are replaced by groups of fresh prompts.

End to end against the scripted TestServer (real HTTP, tiny model), where the reply decides
the reward: prompts in `flat` get "aaaa" from every rollout (reward 1 each: no signal), the
others a mix (the letter env's reward is the share of a's).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from vfkit.errors import VfkitError
from vfkit.testing.scripted_server import TestServer
from vfkit.train.data import DataOrder
from vfkit.train.phases import train

ROUNDS = "trainer.args.dynamic_sampling_rounds="


@pytest.fixture(autouse=True)
def _train_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))


def _helpers():
    import train_testing

    return train_testing


class FlatFor:
    """"aaaa" for the prompts of the tasks in `flat` (a flat group), GroupResponder otherwise."""

    def __init__(self, flat: set[int] | None) -> None:
        self.flat = flat  # None: every prompt is flat
        self.mixed = _helpers().GroupResponder()
        self.tasks: list[int] = []

    def __call__(self, body: dict[str, Any]) -> str:
        task = int(re.search(r"Task (\d+):", json.dumps(body["messages"])).group(1))
        self.tasks.append(task)
        return "aaaa" if self.flat is None or task in self.flat else self.mixed(body)


def groups_in_file(run_dir: Path, step: int) -> list[list[dict]]:
    groups: dict[int, list[dict]] = {}
    for line in (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines():
        record = json.loads(line)
        groups.setdefault(record["group"], []).append(record)
    return [groups[g] for g in sorted(groups)]


def run(model: Path, out: Path, responder: FlatFor, *overrides: str) -> tuple[Path, list[dict]]:
    """Two on-policy steps of the tiny letters run; its run folder and metrics."""
    h = _helpers()
    with TestServer(responder) as srv:
        run_dir = train(h.tiny_config(
            model, out, srv.base_url, "trainer.args.max_steps=2", "trainer.args.async_level=0",
            *overrides))
    return run_dir, h.metrics(run_dir)


def test_flat_groups_are_replaced_until_the_batch_has_signal(tiny_model_path, tmp_path) -> None:
    step1 = DataOrder(16, 2, seed=0).indices(1)  # the tiny config: 2 prompts x 4 a step
    responder = FlatFor(set(step1))
    run_dir, rows = run(tiny_model_path, tmp_path, responder, ROUNDS + "3")
    groups = groups_in_file(run_dir, 1)
    ids = [g[0]["example_id"] for g in groups]
    # the step's own prompts first (flat), then two fresh ones, which had signal: one round
    assert ids[:2] == step1 and len(ids) == 4 and not set(ids[2:]) & set(step1)
    assert ids[2:] == DataOrder(16, 2, seed=0).refill(1, 1, 2, set(step1))
    assert [len({r["reward"] for r in g}) for g in groups] == [1, 1, 4, 4]
    first = rows[0]
    assert (first["groups/kept"], first["groups/filtered"], first["groups/resampled"]) == (2, 2, 2)
    assert first["samples/trained"] == 8  # a full batch with signal
    # the reward metric covers every rollout sampled, the flat ones too
    everything = [r["reward"] for g in groups for r in g]
    assert first["reward/mean"] == pytest.approx(sum(everything) / len(everything))


def test_without_it_a_flat_step_trains_on_what_is_left(tiny_model_path, tmp_path) -> None:
    step1 = DataOrder(16, 2, seed=0).indices(1)
    run_dir, rows = run(tiny_model_path, tmp_path, FlatFor(set(step1)))
    assert [g[0]["example_id"] for g in groups_in_file(run_dir, 1)] == step1
    assert (rows[0]["groups/kept"], rows[0]["groups/resampled"]) == (0, 0)


def test_rounds_stop_at_the_limit_and_the_run_goes_on(tiny_model_path, tmp_path) -> None:
    responder = FlatFor(None)  # nothing has signal: every round comes back flat
    run_dir, rows = run(tiny_model_path, tmp_path, responder, ROUNDS + "2")
    assert [m["step"] for m in rows] == [1, 2]
    assert [len(groups_in_file(run_dir, s)) for s in (1, 2)] == [6, 6]  # 2 + 2 rounds of 2
    assert [(m["groups/kept"], m["groups/resampled"]) for m in rows] == [(0, 4), (0, 4)]
    assert len(responder.tasks) == 2 * 6 * 4


def test_a_rerun_samples_the_same_refills(tiny_model_path, tmp_path) -> None:
    step1 = DataOrder(16, 2, seed=0).indices(1)
    first, _ = run(tiny_model_path, tmp_path / "a", FlatFor(set(step1)), ROUNDS + "1")
    again, _ = run(tiny_model_path, tmp_path / "b", FlatFor(set(step1)), ROUNDS + "1")
    for step in (1, 2):
        a, b = groups_in_file(first, step), groups_in_file(again, step)
        assert [[(r["example_id"], r["completion"]) for r in g] for g in a] == \
            [[(r["example_id"], r["completion"]) for r in g] for g in b]


def test_it_needs_the_zero_group_filter(tiny_model_path, tmp_path) -> None:
    h = _helpers()
    with pytest.raises(VfkitError, match=r"dynamic_sampling_rounds.*filter_zero_advantage"):
        h.tiny_config(tiny_model_path, tmp_path, "", "trainer.args.dynamic_sampling_rounds=1",
                      "trainer.args.filter_zero_advantage=false")


def test_refill_rows_are_seeded_fresh_and_distinct() -> None:
    order = DataOrder(10, 3, seed=5)
    taken = {*order.indices(2), 9}
    rows = order.refill(2, 1, 4, taken)
    assert rows == order.refill(2, 1, 4, taken) and rows != order.refill(2, 2, 4, taken)
    assert len(set(rows)) == 4 and not taken & set(rows)
    assert order.indices(2) == DataOrder(10, 3, seed=5).indices(2)  # the order is untouched
    crowded = order.refill(2, 1, 9, taken)  # 6 rows left: repeats, never a taken row
    assert len(crowded) == 9 and set(crowded) <= set(range(10)) - taken
    assert set(order.refill(2, 1, 3, set(range(10)))) <= set(range(10))  # all taken: any row


def test_later_rounds_do_not_repeat_earlier_refills(tiny_model_path, tmp_path) -> None:
    responder = FlatFor(None)  # every round flat: 3 rounds of 2 fresh prompts each
    run_dir, _ = run(tiny_model_path, tmp_path, responder, ROUNDS + "3",
                     "trainer.args.max_steps=1")
    ids = [g[0]["example_id"] for g in groups_in_file(run_dir, 1)]
    assert len(ids) == 8 and len(set(ids)) == 8
