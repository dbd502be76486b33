#!/usr/bin/env bash
# GPU session, device call 1 (carry [".gpu/call1"] from ../shared/gpu/pack.sh): install, the
# gpu-marked tests, then the whole suite until S1_TOTAL seconds are up. SmolLM2 reaches the
# machine only in call 2, so the tests that need it skip here. Logs come back under $OUT;
# every test is listed (-v), so a run the clock stops still says what failed.
#   S1_TOTAL=265 bash benchmarks/gpu_session/call1.sh      (run timeout_s ~ S1_TOTAL + 45)
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
bash .gpu/call1/device-setup.sh --no-tests || exit 1
. .gpu/call1/device-env.sh
{ nvidia-smi; nproc; python3 -m pip list 2>/dev/null \
  | grep -iE "^(torch|transformers|peft|accelerate|trl|openai|datasets) "; } > "$OUT/machine.txt" 2>&1
echo "installed at $(el) s"
PYTEST=(python3 -m pytest -o addopts= -p no:cacheprovider -v -rfE --tb=short -W ignore)
timeout -s INT 75 "${PYTEST[@]}" --timeout 70 tests/test_gpu.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc=$? at $(el) s"; tail -2 "$OUT/gpu-tests.log"
# call 2 decodes through CUDA graphs only if the graph server's test passed here
grep -qE "test_graph_server_keeps_sampling.* PASSED" "$OUT/gpu-tests.log" && touch /tmp/vfkit_graphs_ok
left=$(( ${S1_TOTAL:-285} - $(el) ))
timeout -s INT "$left" "${PYTEST[@]}" --timeout 110 -n 14 --dist loadfile \
  --ignore=tests/test_gpu.py tests environments > "$OUT/pytest.log" 2>&1
echo "suite rc=$? at $(el) s"
grep -E "(FAILED|ERROR) " "$OUT/pytest.log" | sort -u | head -40; tail -1 "$OUT/pytest.log"
