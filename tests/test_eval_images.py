"""`vf-eval` over the image environments (shapes, zoom): the real CLI in a subprocess against the
scripted server; results keep the images as data URLs, and `vf-rl report` shows them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_eval_cli import read_rows

from vfkit.images import load_image, message_image_urls
from vfkit.testing.child_env import child_env
from vfkit.testing.scripted_server import Reply, TestServer

ROOT = Path(__file__).resolve().parents[1]
ENV_DIRS = [ROOT / "environments" / "shapes", ROOT / "environments" / "zoom"]
SMALL = '{"num_train_examples": 4, "num_eval_examples": 3}'


def responder(body: dict[str, Any]) -> str | Reply:
    """zoom: one zoom into the top-left corner, then answer 7; shapes: answer 1."""
    last = body["messages"][-1]
    if body.get("tools") and last["role"] == "user":
        return Reply(tool_calls=[{"name": "zoom", "arguments": {"x1": 0, "y1": 0, "x2": 32,
                                                                "y2": 32}}])
    return "<answer>7</answer>" if body.get("tools") else "<answer>1</answer>"


def run_cli(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = child_env(*ENV_DIRS, ROOT, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def eval_run(env_id: str, base_url: str, out: Path) -> tuple[Path, list[dict[str, Any]]]:
    proc = run_cli("vfkit.cli.eval", env_id, "-m", "test-model", "-b", base_url, "-a", SMALL,
                   "-n", "3", "-r", "2", "-t", "400", "-o", str(out), cwd=out.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[image]" in proc.stdout and "base64" not in proc.stdout  # the sample panel
    (meta,) = out.glob("*/*/metadata.json")
    return meta.parent, read_rows(meta.parent)


@pytest.fixture(scope="module")
def server():
    with TestServer(responder) as srv:
        yield srv


def test_vf_eval_runs_shapes_and_keeps_its_images(server, tmp_path) -> None:
    run_dir, rows = eval_run("shapes", server.base_url, tmp_path / "evals")
    assert len(rows) == 6 and all(r["error"] is None for r in rows)
    for row in rows:
        (url,) = message_image_urls(row["prompt"])  # the scene, pixels and all
        assert load_image(url).size == (96, 96)
        assert row["correct_answer"] == float(row["answer"] == "1")
    sent = {u for request in server.requests for u in message_image_urls(request["messages"])}
    assert {message_image_urls(r["prompt"])[0] for r in rows} <= sent  # what the model saw
    page = report(run_dir)
    assert page.count("<img class='thumb'") == 3  # one scene per distinct prompt shown


def test_vf_eval_runs_zoom_and_keeps_the_tool_images(server, tmp_path) -> None:
    run_dir, rows = eval_run("zoom", server.base_url, tmp_path / "evals")
    assert len(rows) == 6 and all(r["error"] is None for r in rows)
    row = rows[0]
    tool = next(m for m in row["completion"] if m["role"] == "tool")
    (crop_url,) = message_image_urls([tool])
    assert load_image(crop_url).size == (128, 128)  # the 32 px corner enlarged to zoom_size
    assert row["zoom_calls"] == 1.0 and row["curiosity_bonus"] == 0.0  # every rollout zoomed
    page = report(run_dir)
    assert page.count("<img class='thumb'") == 6  # 3 prompts shown, each: scene + crop


def report(run_dir: Path) -> str:
    """Run `vf-rl report` on a vf-eval folder; the page, checked to embed no full image."""
    proc = run_cli("vfkit.cli.rl", "report", str(run_dir), cwd=run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (run_dir / "report.html").read_text()
    assert "<h1>Eval" in page and "avg_reward" in page
    assert "data:image/png" not in page  # thumbnails only (JPEG), never the originals
    return page
