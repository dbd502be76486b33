"""`vf-rl report`, `vf-rl watch` and `vf-rl --clean` on a run folder written by hand."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vfkit.launch.report import read_jsonl, reward_fn_keys, series
from vfkit.launch.watch import render_text, sparkline
from vfkit.train.rundir import RunDir


def _metrics(step: int) -> dict:
    row = {
        "step": step,
        "reward/mean": 0.1 * step,
        "reward/std": 0.05,
        "reward/exact": 0.1 * step,
        "reward/format": 1.0,
        "loss": 0.5 - 0.01 * step,
        "grad_norm": 1.2,
        "kl/mismatch": 0.001,
        "kl/base": 0.01 * step,
        "ratio/mean": 1.0,
        "ratio/min": 0.8,
        "ratio/max": 1.3,
        "clip/frac": 0.02,
        "entropy": 2.0,
        "tokens_per_s": 100.0 + step,
        "time/generate": 3.0,
        "time/wait": 0.5,
        "time/train": 2.0,
        "time/sync": 0.2,
        "truncated/frac": 0.0,
        "errors": 0,
        "policy/lag": 1,
    }
    if step % 2 == 0:
        row |= {"eval/reward/mean": 0.08 * step, "eval/reward/exact": 0.08 * step}
    return row


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "outputs" / "demo")
    run.rollouts.mkdir(parents=True)
    lines = [json.dumps(_metrics(s)) for s in range(1, 7)]
    run.metrics.write_text("\n".join(lines) + '\n{"step": 7, "rew')  # a line being written
    (run.root / "config.toml").write_text('model = "tiny"\n[env]\nid = "reverse-text"\n')
    for step in (2, 4):
        rows = [
            {
                "prompt": [{"role": "user", "content": f"reverse abc {i}"}],
                "completion": [{"role": "assistant", "content": "<script>x</script> cba"}],
                "reward": 0.5,
                "metrics": {"exact": 0.5},
                "answer": "cba",
            }
            for i in range(5)
        ]
        (run.rollouts / f"step_{step}.jsonl").write_text("\n".join(map(json.dumps, rows)))
    return run


def test_series_skip_missing_and_broken_values(run: RunDir) -> None:
    rows = read_jsonl(run.metrics)
    assert len(rows) == 6  # the half-written 7th line is skipped
    assert series(rows, "eval/reward/mean")[0] == [2.0, 4.0, 6.0]
    assert reward_fn_keys(rows) == ("eval/reward/exact", "reward/exact", "reward/format")


def test_report_writes_html_and_every_png_it_links(run: RunDir) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "vfkit.cli.rl", "report", str(run.root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(run.report)
    page = run.report.read_text()
    links = re.findall(r"<img src='([^']+)'", page)
    names = {Path(link).stem for link in links}
    assert names >= {"reward", "reward_fns", "loss", "kl", "ratio", "throughput", "timing"}
    for link in links:
        assert (run.root / link).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "0.100 → 0.600" in page  # train reward first → last (0.1 * 1 → 0.1 * 6)
    assert "&lt;script&gt;" in page and "<script>" not in page  # rollout text is escaped
    assert page.count("class='rollout'") == 6  # 3 samples from each of the 2 rollout files
    assert "reverse-text" in page


def test_report_of_a_missing_run_names_it(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "vfkit.cli.rl", "report", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "no run folder at" in out.stderr and "nope" in out.stderr


def test_watch_shows_the_latest_step_and_ends_with_the_run(run: RunDir) -> None:
    (run.root / "config.toml").write_text("[trainer.args]\nmax_steps = 10\n")
    text = render_text(run, read_jsonl(run.metrics), {"phase": "running"})
    assert "step 6/10" in text
    # ETA: 4 steps left × (wait 0.5 + train 2.0 + sync 0.2) s = 10.8 s = 0.2 min
    assert "[############        ] 60%  ETA 0.2 min" in text
    assert re.search(r"reward\s+0\.6", text)
    assert sparkline([0, 1, 2]) == "▁▄█"
    run.update_state(phase="done", exit_code=0, started_at=0, ended_at=60)
    out = subprocess.run(
        [sys.executable, "-m", "vfkit.cli.rl", "watch", str(run.root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "finished with exit code 0" in out.stdout


def test_clean_removes_transient_state_and_keeps_results(run: RunDir) -> None:
    run.update_state(supervisor_pid=999_999_999, phase="running", tmux_session=None)
    (run.checkpoints / "step_2").mkdir(parents=True)
    (run.checkpoints / "step_4.tmp").mkdir()
    (run.root / ".lock").write_text("1")  # the run lock stays (vfkit.runlock)
    out = subprocess.run(
        [sys.executable, "-m", "vfkit.cli.rl", "--clean", str(run.root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert not run.state_dir.exists() and (run.root / ".lock").exists()
    assert not (run.checkpoints / "step_4.tmp").exists()
    assert (run.checkpoints / "step_2").is_dir() and run.metrics.exists()
    assert (run.rollouts / "step_2.jsonl").exists()


def test_clean_and_report_refuse_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    """`vf-rl --clean .` in a project once removed its uv.lock and *.pid files."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("uv.lock", "app.pid", "notes.txt"):
        (project / name).write_text("keep me")
    for argv in (["--clean", str(project)], ["report", str(project)]):
        out = subprocess.run([sys.executable, "-m", "vfkit.cli.rl", *argv],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert out.returncode != 0 and "not a" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    assert sorted(p.name for p in project.iterdir()) == ["app.pid", "notes.txt", "uv.lock"]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_clean_kills_a_stale_tmux_session(run: RunDir, tmp_path: Path) -> None:
    env = {**os.environ, "TMUX_TMPDIR": str(tmp_path)}
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", "stale-run", "sleep 600"], env=env, check=True
    )
    run.update_state(supervisor_pid=None, phase="done", tmux_session="stale-run")
    out = subprocess.run(
        [sys.executable, "-m", "vfkit.cli.rl", "--clean", str(run.root)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "killed stale tmux session stale-run" in out.stdout
    alive = subprocess.run(["tmux", "has-session", "-t", "stale-run"], env=env)
    assert alive.returncode != 0


def test_clean_refuses_while_the_run_is_live(run: RunDir) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "vfkit.cli.rl"]
    )
    try:
        run.update_state(supervisor_pid=launcher.pid, phase="running")
        out = subprocess.run(
            [sys.executable, "-m", "vfkit.cli.rl", "--clean", str(run.root)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        launcher.kill()
        launcher.wait()
    assert out.returncode == 1 and "is still running" in out.stderr
    assert run.state_file.exists()


def test_report_out_writes_a_self_contained_copy(run: RunDir, tmp_path: Path) -> None:
    out_dir = tmp_path / "published"
    out = subprocess.run(
        [sys.executable, "-m", "vfkit.cli.rl", "report", str(run.root), "--out", str(out_dir)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    page = (out_dir / "report.html").read_text()
    for link in re.findall(r"<img src='([^']+)'", page):
        assert (out_dir / link).is_file()  # every chart sits beside the copied page
    assert not run.report.exists()  # the run folder was left alone


def test_jsonl_rows_holding_unicode_line_separators_are_read_whole(tmp_path: Path) -> None:
    """results.jsonl keeps text as is (ensure_ascii=False): a completion with U+2028 or U+0085
    (a random model emits them) is one row, not two broken halves dropped; a torn last line is
    still skipped."""
    rows = [{"completion": "a\u2028b\x85c\x1cd"}, {"completion": "plain"}]
    path = tmp_path / "results.jsonl"
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    path.write_text(text + '{"completion": "to')
    assert read_jsonl(path) == rows
