"""The whole race command on a tiny random model: both legs train, snapshot, get scored, and
the report comes out (about 80 s on 2 CPU cores; the numbers of a random model mean nothing).

    PYTHONPATH=$PWD python -m pytest benchmarks/race/test_race_smoke.py -q -m slow
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# byte-level tokens: the tiny model's prompts are longer than SmolLM2's
TINY_SETTINGS = ["trainer.args.max_prompt_len=512", "trainer.args.max_seq_len=1024",
                 "trainer.args.max_tokens=16", 'inference.args={dtype = "float32"}']


@pytest.mark.slow
def test_tiny_race_writes_scored_snapshots_curves_and_table(tmp_path: Path) -> None:
    out = tmp_path / "race"
    cmd = [sys.executable, "-m", "benchmarks.race.run", "--model", "tiny", "--envs",
           "reverse-text", "--seeds", "0", "--budget-s", "24", "--snapshot-every-s", "12",
           "--snapshot-every-steps", "2",
           "--eval-n", "4", "--out", str(out), "--set", *TINY_SETTINGS]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")])}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    points = json.loads((out / "points.json").read_text())
    assert [leg["system"] for leg in points["legs"]] == ["vfkit", "trl"]
    for leg in points["legs"]:
        assert leg["error"] is None, leg["error"]
        assert [s["t_s"] for s in leg["snapshots"]] == [12, 24]
        last = leg["snapshots"][-1]
        assert last["step"] >= 1 and Path(last["path"], "adapter_model.safetensors").exists()
        assert all(0.0 <= s["reward"] <= 1.0 for s in leg["snapshots"])
        assert leg["steps"][-1][0] <= 24.5  # no step counted after the budget
        steps = [s["step"] for s in leg["step_snapshots"]]
        assert steps and all(n % 2 == 0 for n in steps)
    # equal-step points are scored where both systems got to, and only there
    vfkit, trl = ({s["step"]: s for s in leg["step_snapshots"]} for leg in points["legs"])
    assert set(vfkit) & set(trl)
    for snaps, other in ((vfkit, trl), (trl, vfkit)):
        for step, snap in snaps.items():
            assert ("reward" in snap) == (step in other), (step, snap)
    assert 0.0 <= points["base"]["reverse-text"]["reward"] <= 1.0
    assert (out / "reverse-text.png").stat().st_size > 10_000
    table = (out / "results.md").read_text()
    assert table.count("| vfkit (vf-train) |") == table.count("| TRL GRPOTrainer |") == 2
    assert "At equal optimizer steps" in table
