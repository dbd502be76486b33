"""`vf-rl`: launch, watch, stop and report a training run (inference server + trainer).

main.py       the command line          preflight.py  dry-run checks
plan.py       what runs where            runner.py     config -> supervisor (server factory)
supervisor.py foreground run, signals    process.py    children in their own process groups
health.py     /health and log tails      tmux.py       the tmux session
watch.py      live metrics / log views for panes
report.py     report.html + PNGs         clean.py      remove a run's transient state
(run layout and launcher state file: vfkit/train/rundir.py)
"""
