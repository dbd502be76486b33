"""What vf-eval prints: model output never drives the terminal (vfkit.evaluation.display)."""

from __future__ import annotations

import io
import logging

from rich.console import Console
from test_eval_cli import read_rows, run_dirs
from test_eval_hostile import cli  # noqa: F401 (the in-process vf-eval fixture)

from vfkit.evaluation.display import print_summary
from vfkit.evaluation.results import Summary
from vfkit.evaluation.terminal import RewriteLogs, printable
from vfkit.testing.scripted_server import TestServer

HOSTILE = "ok \x1b[31mRED\x1b[0m \u202eRTL\x07\r"  # colour, bidi override, bell, carriage return


def test_printable_writes_control_and_bidi_characters_out():
    assert printable(HOSTILE) == "ok \\x1b[31mRED\\x1b[0m \\u202eRTL\\x07\\x0d"
    assert printable("tabs\tand\nnewlines, é, 日本") == "tabs\tand\nnewlines, é, 日本"
    record = logging.LogRecord("x", logging.WARNING, "f", 1, "failed: %s", (HOSTILE,), None)
    assert RewriteLogs(printable).filter(record) and "\x1b" not in record.getMessage()


def test_the_summary_shows_escapes_instead_of_running_them():
    rows = [{"example_id": 0, "rollout_idx": 0, "reward": 1.0, "error": None,
             "prompt": [{"role": "user", "content": "say it"}],
             "completion": [{"role": "assistant", "content": HOSTILE}]}]  # fmt: skip
    out = io.StringIO()
    print_summary(Console(file=out, width=200), Summary.of(rows, []), rows,
                  rollouts_per_example=1, seed="s", run_dir=None)  # fmt: skip
    text = out.getvalue()
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "\\x1b[31mRED" in text  # shown, visibly


def test_results_keep_the_text_the_terminal_does_not_get(cli, tmp_path):  # noqa: F811
    with TestServer(HOSTILE) as srv:
        code, err = cli("eval-echo", "-b", srv.base_url, "-n", "1", "-r", "1", "-s")
    assert code == 0, err
    assert "\x1b" not in cli.stdout and "\u202e" not in cli.stdout  # they were printed raw
    (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
    assert read_rows(run_dir)[0]["completion"][-1]["content"] == HOSTILE
