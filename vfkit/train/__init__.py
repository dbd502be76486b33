"""Training: `vf-train CONFIG` runs RL on a LoRA adapter, rollouts one step off-policy.

The algorithm is loop.py (one screen); docs/data-path.md maps every stage to its file.
In data-path order:
    config.py, config_fields.py, config_loader.py, config_errors.py, overrides.py
                      the TOML -> typed RunConfig (config_fields: single-value checks, secrets)
    run_checks.py     what the config names, checked before training (also vf-rl --dry-run)
    phases.py         what vf-train runs: train, --phase rollout, --phase update (the wiring)
    rundir.py         every path under outputs/<run>/ and the adapter names, both ways
    placement.py      server backend, GPU ids, CPU thread split, server flags
    cores.py          the trainer takes every CPU core while nothing is generating
    orchestrator.py   live batches: rollouts in their own thread; policy versions; eval
    batches.py        the BatchSource protocol; SavedBatches for --phase update
    data.py           which prompts each step uses (seeded, resumable); rollouts files
    advantages.py     the trainer's use of vfkit/advantage.py; zero-signal filtering
    samples.py        states -> token sequences + loss masks (server ids, never re-tokenized)
    batching.py       padded micro-batches by length (each prompt's tokens run once a step)
    losses/           grpo, dr_grpo, dapo, cispo: pure tensor functions
    update.py         a batch's optimizer step(s) over micro-batches (token stats for metrics)
    policy.py, learner.py   PEFT LoRA on Accelerate; adapter files; probe logprobs
    adapter_sync.py   the adapter client: load, verify, unload, re-load lost adapters
    loop.py           the loop;  checkpoint.py, metrics.py   resume, metrics sinks
    resume.py         the checkpoint a resume starts from, and the keys it may not change
"""
