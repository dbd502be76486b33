#!/usr/bin/env bash
# GPU session, device call 2, sent right after call 1 on the warm machine (carry
# [".gpu/call2"]): vf-train configs/exp.toml, the race against TRL, then the adapter-sync and
# server benchmarks, each on its own clock, outputs tarred under $OUT as they finish.
#   TRAIN_S=140 RACE_S=165 SERVE_S=50 bash .gpu/call2/device-model.sh \
#       bash benchmarks/gpu_session/call2.sh                 (run timeout_s ~ 420)
# GRAPHS=on|off: CUDA-graph decoding (vf-serve --cuda-graphs) in every piece; by default on
# exactly when call 1's graph server test passed on this machine.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
export PYTHONPATH=/tmp/site:$PWD
graphs=${GRAPHS:-$([ -e /tmp/vfkit_graphs_ok ] && echo on || echo off)}
echo "cuda graphs: $graphs"
rm -rf outputs && mkdir -p outputs
pack() { tar czf "$OUT/$1.tgz" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' "$2"; }
timeout -s INT "${TRAIN_S:-150}" vf-train configs/exp.toml trainer.args.output_dir=outputs/gpu \
  trainer.args.run_name=exp "inference.args.cuda_graphs=\"$graphs\"" > "$OUT/vftrain.log" 2>&1
echo "vf-train rc=$? at $(el) s"; tail -3 "$OUT/vftrain.log"; pack vftrain outputs/gpu
timeout -s INT "${RACE_S:-175}" python3 -m benchmarks.race.run --envs arithmetic --seeds 0 \
  --budget-s "${BUDGET:-60}" --snapshot-every-s 20 --snapshot-every-steps 20 --eval-n 100 \
  --set "inference.args.cuda_graphs=\"$graphs\"" --out outputs/race-gpu > "$OUT/race.log" 2>&1
echo "race rc=$? at $(el) s"; tail -8 "$OUT/race.log"; pack race outputs/race-gpu
timeout -s INT 40 python3 benchmarks/adapter_sync.py --rounds 10 > "$OUT/bench.log" 2>&1
echo "adapter_sync rc=$? at $(el) s"
timeout -s INT "${SERVE_S:-60}" python3 benchmarks/serve.py --seconds 5 \
  --server-args "--cuda-graphs $graphs" >> "$OUT/bench.log" 2>&1
echo "serve rc=$? at $(el) s"; grep '^{' "$OUT/bench.log" | tail -12
