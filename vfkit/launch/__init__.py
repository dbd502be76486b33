"""`vf-rl`: launch, watch, stop and report a training run (inference server + trainer).

preflight.py  dry-run checks             (the command line: vfkit/cli/rl.py)
plan.py       what runs where            runner.py     config -> supervisor (server factory)
supervisor.py foreground run, signals    process.py    children in their own process groups
tmux.py       the tmux session           watch.py      live metrics / log views for panes
(the server process and its /health: vfkit/serve/launcher.py)
report.py     report.html + PNGs         clean.py      remove a run's transient state
(run layout and launcher state file: vfkit/train/rundir.py)
"""
