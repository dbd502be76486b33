"""Race vfkit's trainer against TRL's GRPOTrainer for the same wall-clock budget.

    python -m benchmarks.race.run --envs reverse-text --seeds 0 --budget-s 900 --out outputs/race

See README.md in this folder for what is matched, what is not, and the recorded commands.
"""
