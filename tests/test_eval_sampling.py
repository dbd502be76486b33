"""vf-eval's sampling args: which -S keys are taken, and what each request then carries.

The merge itself lives in vfkit/client/sampling.py (shared with training); requests go over
real HTTP to the scripted TestServer, which records every body.
"""

from __future__ import annotations

import json

import pytest
from test_eval_cli import echo_responder, run_dirs
from test_eval_hostile import cli  # noqa: F401 (the in-process vf-eval fixture)

from vfkit.client.sampling import drop_sampling_keys, merge_sampling_args
from vfkit.testing.scripted_server import TestServer

# an environment with its own limit, as vfkit's packaged ones have (reverse-text: 48)
CAPPED_ENV = '''
from datasets import Dataset
import vfkit as vf

def load_environment():
    rows = [{"question": "Repeat: apple", "answer": "apple"}]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), sampling_args={"max_tokens": 48},
                            rubric=vf.Rubric(funcs=[lambda completion, answer: 1.0]))
'''


def test_a_token_limit_replaces_the_other_spelling_below_it():
    # the server got both: max_completion_tokens 5 from -S and the environment's max_tokens 48
    assert merge_sampling_args({"max_tokens": 48}, {"max_completion_tokens": 5}) == {
        "max_completion_tokens": 5}
    assert merge_sampling_args({"max_completion_tokens": 5, "top_p": 0.5}, {"max_tokens": 9}) == {
        "top_p": 0.5, "max_tokens": 9}
    assert merge_sampling_args({"max_tokens": 48}, {"temperature": 0.1}) == {
        "max_tokens": 48, "temperature": 0.1}  # a layer without a limit keeps the one below


def test_drop_sampling_keys_reaches_into_extra_body_and_both_limit_spellings():
    args = {"max_completion_tokens": 5, "top_k": 3, "temperature": 0.5}
    assert drop_sampling_keys(args, ["max_tokens", "top_k"]) == {"temperature": 0.5}
    assert drop_sampling_keys(args, []) == {"temperature": 0.5, "max_completion_tokens": 5,
                                            "extra_body": {"top_k": 3}}


@pytest.mark.parametrize(
    ("sampling", "sent", "absent"),
    [
        ('{"max_completion_tokens": 5}', {"max_completion_tokens": 5}, "max_tokens"),
        ('{"max_tokens": null}', {}, "max_tokens"),  # null unsets the environment's limit
        ('{"max_tokens": 7}', {"max_tokens": 7}, "max_completion_tokens"),
    ],
)
def test_what_the_requests_carry(cli, tmp_path, monkeypatch, sampling, sent, absent):  # noqa: F811
    (tmp_path / "eval_capped.py").write_text(CAPPED_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    with TestServer(echo_responder) as srv:
        code, err = cli("eval-capped", "-b", srv.base_url, "-n", "1", "-r", "1", "-S", sampling,
                        "-s")
        assert code == 0, err
        (body,) = srv.requests
    assert {k: body.get(k) for k in sent} == sent and absent not in body
    (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["sampling_args"] == json.loads(sampling)  # the flags, as --resume pins them
    assert meta["sampling_args_sent"] == sent  # what went out
