"""Play prime-rl's orchestrator against a vfkit environment (run inside a verifiers venv).

What prime-rl does since 2026-08, reduced to its contract: load the taskset by id, start the v1
env server for it, send each task to the server once per group member with the *train* client
(vLLM's token-in `/inference/v1/generate`, prompts rendered client-side), read back the traces,
and turn each trace branch into a training sample (token ids, loss mask = the model-sampled
tokens, sampling logprobs, advantage = reward - group mean).

    python orchestrator.py TASKSET_ID BASE_URL TOKENIZER_DIR OUT.json [ENV_ARGS_JSON]

Writes {"samples": [...]} to OUT.json for the test to check.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import sys

import verifiers.v1 as vf
from verifiers.v1.configs.client import TrainClientConfig
from verifiers.v1.serve import EnvClient, serve_env
from verifiers.v1.utils.loaders import env_config_type, taskset_config_type

GROUP_SIZE = 2


def build_config(taskset_id: str, env_args: dict) -> vf.EnvConfig:
    # VFKIT_SYSTEM_PROMPT: a file whose text overrides the system prompt (as GEPA's candidates)
    override = os.environ.get("VFKIT_SYSTEM_PROMPT")
    extra = {"system_prompt": override} if override else {}
    taskset = taskset_config_type(taskset_id)(id=taskset_id, args=env_args, split="eval",
                                              **extra)
    return env_config_type(taskset_id)(taskset=taskset)


def start_env_server(config: vf.EnvConfig) -> tuple[mp.Process, str]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=serve_env, kwargs={
        "max_workers": 1, "address": "tcp://127.0.0.1:0", "address_queue": queue,
        "config_data": config.model_dump(mode="json")}, daemon=True)
    proc.start()
    return proc, queue.get(timeout=120)


# the shape of what prime-rl's orchestrator sends (its sampling config, the env config's
# extra_body defaults, a per-request cache salt): vLLM-only keys the openai SDK does not take
PRIME_RL_SAMPLING = {
    "temperature": 1.0, "top_p": 1.0, "logprobs": True,
    "extra_body": {"top_k": -1, "min_p": 0.0, "return_token_ids": True, "cache_salt": "0"},
}


def trace_to_samples(trace: vf.Trace, advantage: float) -> list[dict]:
    return [{"token_ids": b.token_ids, "mask": b.sampled_mask, "logprobs": b.logprobs,
             "advantage": advantage, "reward": trace.reward, "ok": trace.ok,
             "errors": [e.message for e in trace.errors],
             "rewards": {k: r.value for k, r in trace.rewards.items() if r is not None},
             "row": trace.task.data.model_extra.get("row") if trace.task.data.model_extra
             else None}
            for b in trace.branches]


async def orchestrate(taskset_id: str, base_url: str, tokenizer_dir: str, env_args: dict) -> list:
    config = build_config(taskset_id, env_args)
    tasks = list(vf.load_taskset(config.taskset))
    proc, address = start_env_server(config)
    client = EnvClient(address)
    try:
        await client.wait_for_server_startup(timeout=120)
        train_client = TrainClientConfig(base_url=base_url, renderer_model_name=tokenizer_dir)
        sampling = vf.SamplingConfig(**PRIME_RL_SAMPLING)
        samples = []
        for task in tasks:
            episodes = await asyncio.gather(*(
                client.run(train_client, "tiny", sampling, task.data.model_dump(mode="json"))
                for _ in range(GROUP_SIZE)))
            traces = [trace for episode in episodes for trace in episode.traces]
            mean = sum(t.reward for t in traces) / len(traces)
            for trace in traces:
                samples += trace_to_samples(trace, trace.reward - mean)
        return samples
    finally:
        await client.close()
        proc.terminate()
        proc.join(30)


def main() -> None:
    taskset_id, base_url, tokenizer_dir, out = sys.argv[1:5]
    env_args = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    samples = asyncio.run(orchestrate(taskset_id, base_url, tokenizer_dir, env_args))
    with open(out, "w") as f:
        json.dump({"samples": samples}, f)


if __name__ == "__main__":
    main()
