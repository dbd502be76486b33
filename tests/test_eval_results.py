"""results.jsonl rows, torn-line repair, resume planning, summaries (vfkit.evaluation.results)."""

from __future__ import annotations

import json
import math

import pytest

from vfkit.errors import ConfigError
from vfkit.evaluation.results import (
    ResultsWriter,
    Summary,
    completed_rollouts,
    load_results,
    read_metadata,
    state_to_row,
    write_metadata,
)
from vfkit.evaluation.runner import model_folder_name, plan_groups


def _state(example_id: int, reward: float, **extra: object) -> dict:
    return {
        "example_id": example_id,
        "prompt": [{"role": "user", "content": "q"}],
        "completion": [{"role": "assistant", "content": "a"}],
        "answer": "a",
        "task": "t",
        "info": {"k": 1},
        "reward": reward,
        "metrics": {"exact": reward, "reward": 9.0},
        "timing": {"total_ms": 1.5},
        "error": None,
        "is_truncated": False,
        "trajectory": [{"huge": "not saved unless asked"}],
        **extra,
    }


def test_row_has_fixed_columns_metrics_and_only_chosen_state_keys():
    row = state_to_row(_state(3, 1.0, turn=2, custom={1, 2}), 1, ["turn", "custom", "absent"])
    assert row["example_id"] == 3 and row["rollout_idx"] == 1
    assert row["exact"] == 1.0
    assert row["metric_reward"] == 9.0  # a metric named like a fixed column is renamed
    assert row["reward"] == 1.0
    assert row["turn"] == 2 and row["custom"] == [1, 2] and row["absent"] is None
    assert "trajectory" not in row
    json.dumps(row)  # plain JSON


def test_writer_appends_whole_groups_and_flushes_every_n(tmp_path):
    writer = ResultsWriter(tmp_path, save_every=4)
    writer.add_group([state_to_row(_state(0, 1.0), k) for k in range(3)])
    assert (tmp_path / "results.jsonl").read_text() == ""  # 3 < 4 rollouts waiting
    writer.add_group([state_to_row(_state(1, 0.0), k) for k in range(3)])
    assert len(load_results(tmp_path / "results.jsonl")) == 6  # 6 >= 4: both groups written
    writer.add_group([state_to_row(_state(2, 0.0), 0)])
    writer.flush()
    assert len(load_results(tmp_path / "results.jsonl")) == 7


def test_torn_last_line_is_dropped_and_repaired(tmp_path):
    path = tmp_path / "results.jsonl"
    good = [json.dumps(state_to_row(_state(i, 1.0), 0)) for i in range(2)]
    path.write_text("\n".join(good) + "\n" + good[0][:25])  # killed in the middle of a write
    assert [r["example_id"] for r in load_results(path)] == [0, 1]
    assert path.read_text().endswith(good[0][:25])  # read-only unless repair=True
    rows = load_results(path, repair=True)
    assert len(rows) == 2 and path.read_text() == "\n".join(good) + "\n"


def test_duplicate_rows_are_counted_once(tmp_path):
    path = tmp_path / "results.jsonl"
    line = json.dumps(state_to_row(_state(0, 1.0), 0))
    path.write_text(f"{line}\n{line}\n")
    assert len(load_results(path)) == 1


def test_plan_groups_skips_done_rollouts_and_keeps_missing_indices():
    inputs = [{"example_id": i} for i in range(3)]
    done = completed_rollouts(
        [{"example_id": 0, "rollout_idx": k} for k in range(3)]
        + [{"example_id": 1, "rollout_idx": 0}, {"example_id": 1, "rollout_idx": 2}]
    )
    assert plan_groups(inputs, 3, done) == {1: [1], 2: [0, 1, 2]}


def test_summary_means_stds_and_per_rollout_index():
    rows = [state_to_row(_state(i, float(i % 2)), k) for i in range(2) for k in range(2)]
    rows[0]["error"] = "RolloutError: boom"
    summary = Summary.of(rows, ["exact"])
    mean, std = summary.columns["reward"]
    assert mean == 0.5 and std == 0.5  # rewards 0,0,1,1: mean 0.5, population std 0.5
    assert summary.by_rollout_idx["exact"] == {0: 0.5, 1: 0.5}
    assert summary.errors == 1 and summary.num_rollouts == 4
    assert math.isnan(Summary.of([], ["exact"]).columns["reward"][0])
    assert Summary.of([], ["exact"]).averages()["reward"] is None


def test_failed_rollouts_are_counted_but_not_averaged():
    rows = [state_to_row(_state(i, r), 0) for i, r in enumerate((1.0, 0.0, 1.0))]
    rows.append(state_to_row(_state(3, 0.0, error="ValueError: env bug", stop_condition="error"),
                             0))
    rows.append(state_to_row(_state(4, 0.0, stop_condition="prompt_too_long"), 0))
    summary = Summary.of(rows, ["exact"])
    # the failed row (reward 0) is out: (1 + 0 + 1 + 0) / 4 = 0.5, not 2 / 5 = 0.4
    assert summary.columns["reward"][0] == 0.5 and summary.by_rollout_idx["reward"] == {0: 0.5}
    assert (summary.num_rollouts, summary.scored, summary.failed) == (5, 4, 1)
    assert summary.errors == 1 and summary.prompt_too_long == 1
    only_failed = Summary.of(rows[3:4], ["exact"])
    assert only_failed.averages() == {"reward": None, "exact": None}  # nothing scored


def test_metadata_round_trip_and_missing_metadata_error(tmp_path):
    write_metadata(tmp_path, {"env_id": "x", "avg_reward": float("nan")})
    assert read_metadata(tmp_path) == {"env_id": "x", "avg_reward": None}
    with pytest.raises(ConfigError, match=r"no metadata\.json"):
        read_metadata(tmp_path / "nope")


def test_model_folder_name(tmp_path):
    assert model_folder_name("HuggingFaceTB/SmolLM2-135M-Instruct") == (
        "HuggingFaceTB--SmolLM2-135M-Instruct"
    )
    (tmp_path / "tiny-model").mkdir()
    assert model_folder_name(str(tmp_path / "tiny-model")) == "tiny-model"


def _lines(n: int) -> list[str]:
    return [json.dumps(state_to_row(_state(i, 1.0), 0)) for i in range(n)]


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ('{"example_id": 1, "rollout_', "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"example_id": "one", "rollout_idx": 0}', "integer 'example_id'"),
        ("\xff\xfe garbage", "not valid JSON"),
    ],
)
def test_a_damaged_line_in_the_middle_is_an_error_naming_file_and_line(tmp_path, bad, why):
    path = tmp_path / "results.jsonl"
    good = _lines(3)
    text = f"{good[0]}\n{bad}\n{good[1]}\n{good[2]}\n"
    path.write_text(text, errors="surrogateescape")
    with pytest.raises(ConfigError) as info:
        load_results(path, repair=True)
    assert f"{path} line 2" in str(info.value) and why in str(info.value)
    assert path.read_text(errors="surrogateescape") == text  # nothing cut away


def test_a_torn_last_line_is_dropped_with_a_warning_naming_it(tmp_path, caplog):
    path = tmp_path / "results.jsonl"
    good = _lines(2)
    path.write_text(f"{good[0]}\n{good[1]}")  # complete JSON, but the newline never came
    with caplog.at_level("WARNING", logger="vfkit.evaluation.results"):
        assert [r["example_id"] for r in load_results(path, repair=True)] == [0]
    assert f"{path} line 2" in caplog.text and "torn" in caplog.text
    assert path.read_text() == f"{good[0]}\n"  # appends start on a fresh line
