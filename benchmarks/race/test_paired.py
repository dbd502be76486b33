"""The paired comparison reads what the race writes and computes the per-seed statistics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.race.paired import Side, main, pair, rewards_by_seed
from benchmarks.race.report import write_report
from benchmarks.race.settings import Leg
from vfkit.errors import VfkitError

BASE = {"reward": 0.33, "sample": {"prompt": "Calculate 0 - 2.", "answer": "2"}}
ARGS = {"budget_s": 900, "snapshot_every_s": 300, "eval_n": 100, "eval_dtype": "float32"}


def race(out: Path, rewards: dict[tuple[str, int], tuple[float, float]]) -> Path:
    """A race folder as the race writes it: (system, seed) -> (reward at 300 s, at step 10)."""
    legs = [Leg(system=system, env_id="arithmetic", seed=seed, budget_s=900,
                snapshot_every_s=300, model="m", config="c", out=f"{system}{seed}")
            for system, seed in rewards]
    records = {leg.out: {"ticks": [300.0, 900.0], "steps": [[60.0, 10]], "error": None,
                         "snapshots": [{"t_s": 300.0, "step": 16,
                                        "reward": rewards[leg.system, leg.seed][0]}],
                         "step_snapshots": [{"t_s": 60.0, "step": 10,
                                             "reward": rewards[leg.system, leg.seed][1]}]}
               for leg in legs}
    out.mkdir()
    write_report(out, legs, records, {"arithmetic": BASE}, ARGS)
    return out


def test_differences_are_taken_seed_by_seed_with_their_standard_error(tmp_path: Path) -> None:
    # seed 0 from one race, seeds 1-2 from another; TRL's legs in a third
    a = Side((race(tmp_path / "a0", {("vfkit", 0): (0.5, 0.60)}),
              race(tmp_path / "a1", {("vfkit", 1): (0.5, 0.40), ("vfkit", 2): (0.5, 0.70)})))
    trl = race(tmp_path / "b", {("trl", s): (0.4, r) for s, r in enumerate((0.50, 0.60, 0.60))})
    b = Side.parse(f"{trl}:trl")
    p = pair(rewards_by_seed(a, "arithmetic", 10, None),
             rewards_by_seed(b, "arithmetic", 10, None))
    assert p.seeds == [0, 1, 2] and p.diffs == pytest.approx([0.1, -0.2, 0.1])
    assert p.mean_diff == pytest.approx(0.0)
    # sample sd of (0.1, -0.2, 0.1) is sqrt(0.03) -> standard error sqrt(0.03) / sqrt(3) = 0.1
    assert p.stderr == pytest.approx(0.1)
    assert p.wins == (2, 1)
    at_300 = pair(rewards_by_seed(a, "arithmetic", None, 300.0),
                  rewards_by_seed(b, "arithmetic", None, 300.0))
    assert at_300.diffs == pytest.approx([0.1, 0.1, 0.1]) and at_300.stderr == pytest.approx(0.0)


def test_the_command_prints_the_table_and_names_seeds_it_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    folder = race(tmp_path / "r", {("vfkit", 0): (0.5, 0.6), ("vfkit", 1): (0.5, 0.4),
                                   ("trl", 0): (0.4, 0.5), ("trl", 1): (0.4, 0.6),
                                   ("trl", 2): (0.4, 0.6)})
    assert main([str(folder), f"{folder}:trl", "--env", "arithmetic", "--step", "10"]) == 0
    text = capsys.readouterr().out
    assert "| difference | +0.100 | -0.200 | -0.050 |" in text
    assert "Paired over 2 seeds: -0.050 ± 0.150" in text
    assert "Left out, scored on one side only: seeds [2]." in text


def test_one_seed_has_no_standard_error(tmp_path: Path) -> None:
    folder = race(tmp_path / "r", {("vfkit", 0): (0.5, 0.6), ("trl", 0): (0.4, 0.5)})
    p = pair(rewards_by_seed(Side((folder,)), "arithmetic", 10, None),
             rewards_by_seed(Side((folder,), "trl"), "arithmetic", 10, None))
    assert math.isnan(p.stderr)


def test_bad_input_names_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = race(tmp_path / "r", {("vfkit", 0): (0.5, 0.6)})
    step10 = ["--env", "arithmetic", "--step", "10"]
    assert main([str(tmp_path / "nowhere"), str(folder), *step10]) == 2
    assert "nowhere/points.json: no points.json there" in capsys.readouterr().err
    assert main([str(folder), f"{folder}:trl", *step10]) == 2
    assert ":trl: no trl leg on arithmetic has a score at step 10" in capsys.readouterr().err
    other = race(tmp_path / "o", {("trl", 1): (0.4, 0.5)})
    assert main([str(folder), f"{other}:trl", *step10]) == 2
    assert "no seed in common: one side has seeds [0], the other [1]" in capsys.readouterr().err
    with pytest.raises(VfkitError, match="seed 0 on arithmetic is in more than one"):
        rewards_by_seed(Side((folder, folder)), "arithmetic", 10, None)
