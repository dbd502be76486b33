"""Seeded rollouts: every request vf-train sends carries a seed from (seed, step, group,
rollout), so a rerun samples the same completions and a resumed run the ones it would have."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from vfkit.client.sampling import SEED_RANGE, derive_seed, seed_rollout, seed_turn
from vfkit.testing.scripted_server import TestServer
from vfkit.train.phases import train


@pytest.fixture(autouse=True)
def _train_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))


def test_derived_seeds_are_stable_distinct_and_in_the_servers_range() -> None:
    assert derive_seed(0, "step", 1, 0) == derive_seed(0, "step", 1, 0)
    seeds = {derive_seed(s, "step", step, g) for s in (0, 1) for step in (1, 2) for g in range(4)}
    assert len(seeds) == 16 and all(0 <= x < SEED_RANGE for x in seeds)
    # fixed by its inputs alone, not by the process's hash salt (a rerun is another process)
    code = "from vfkit.client.sampling import derive_seed; print(derive_seed(0, 'step', 1, 0))"
    for salt in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, "PYTHONHASHSEED": salt}, check=True)
        assert int(out.stdout) == derive_seed(0, "step", 1, 0)


def test_a_group_seed_gives_rollout_k_seed_plus_k_and_each_turn_its_own() -> None:
    args = {"temperature": 0.7, "seed": SEED_RANGE - 1}
    assert [seed_rollout(args, k)["seed"] for k in range(3)] == [SEED_RANGE - 1, 0, 1]
    assert seed_rollout({"temperature": 0.7}, 3) == {"temperature": 0.7}  # unseeded stays so
    assert seed_rollout({"seed": True}, 1) == {"seed": True}  # not an integer seed
    first = {"seed": 5}
    assert seed_turn(first, 0) == first
    later = [seed_turn(first, t)["seed"] for t in (1, 2)]
    assert len({5, *later}) == 3 and later == [seed_turn(first, t)["seed"] for t in (1, 2)]


def _seeds(bodies: list[dict]) -> list[tuple[str, int]]:
    return sorted((json.dumps(b["messages"]), b["seed"]) for b in bodies)


def test_every_rollout_request_is_seeded_and_a_rerun_sends_the_same_seeds(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    import train_testing

    sent = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        with TestServer(train_testing.GroupResponder()) as srv:
            cfg = train_testing.tiny_config(
                tiny_model_path, tmp_path / name, srv.base_url, "trainer.args.max_steps=2",
                f"trainer.args.seed={seed}", "trainer.args.eval_steps=1",
                "trainer.args.eval_num_examples=3")
            train(cfg)
            sent[name] = [b for b in srv.requests if "messages" in b]
    bodies = sent["a"]
    assert len(bodies) == 2 * 8 + 3 * 3  # two batches of 2 groups x 4; evals at steps 0, 1, 2
    assert all(isinstance(b.get("seed"), int) for b in bodies)
    # each training rollout its own seed; each eval prompt the same one at every eval
    uses = Counter(b["seed"] for b in bodies)
    assert sorted(Counter(uses.values()).items()) == [(1, 16), (3, 3)]
    assert _seeds(sent["b"]) == _seeds(bodies)  # the same run again: the same seeds
    assert not set(_seeds(sent["c"])) & set(_seeds(bodies))  # another seed: none shared


@pytest.mark.slow
def test_a_rerun_with_the_same_seed_samples_the_same_completions_from_vf_serve(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    import train_testing

    def completions(name: str, seed: int) -> list[list[list[int]]]:
        cfg = train_testing.tiny_config(
            tiny_model_path, tmp_path / name, "", "trainer.args.max_steps=3",
            f"trainer.args.seed={seed}", 'inference.args={dtype = "float32", threads = 1}',
            "trainer.args.eval_steps=0")
        run_dir = train(cfg)
        steps = []
        for step in (1, 2, 3):  # step 3 was sampled by the adapter of step 1
            rows = [json.loads(line) for line in
                    (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
            steps.append([r["trajectory"][0]["tokens"]["completion_ids"] for r in rows])
        return steps

    first, again, other = completions("a", 0), completions("b", 0), completions("c", 1)
    assert first == again
    assert all(len(set(map(tuple, step))) > 1 for step in first)  # a group's rollouts differ
    assert first[0] != other[0]
