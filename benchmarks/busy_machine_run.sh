#!/usr/bin/env bash
# A one-step tiny CPU run of the driver (python -m megatron_dapo.train: the tiny random Qwen2 and
# the parity reward of tests/e2e/fixtures.py, the HF engine, gloo, Ray) while every core is busy
# (BURNERS busy loops at normal priority, default one per core), timed; issue #44.
#   bash benchmarks/busy_machine_run.sh OUT_DIR           # RAY_worker_niceness as the driver sets it (0)
#   RAY_worker_niceness=15 bash benchmarks/busy_machine_run.sh OUT_DIR   # Ray's own default, for the A/B
# Prints the load average before and after, the driver's exit code and seconds; the driver's
# output is OUT_DIR/driver.txt. Refuses an OUT_DIR that exists. Ends its busy loops on exit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: busy_machine_run.sh OUT_DIR}
if [ -e "$OUT" ]; then echo "busy_machine_run: $OUT exists; give a new directory" >&2; exit 2; fi
mkdir -p "$OUT"
PY=${PYTHON:-.venv/bin/python}
BURNERS=${BURNERS:-$(nproc)}
"$PY" -c "import sys; sys.path.insert(0, '.'); from tests.e2e.fixtures import make_tiny_qwen2_dir, make_prompts; \
make_tiny_qwen2_dir('$OUT/hf'); make_prompts('$OUT/prompts.jsonl')" >/dev/null 2>&1 || { echo "busy_machine_run: could not build the tiny model" >&2; exit 1; }
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq "$BURNERS"); do "$PY" -c "while True: pass" & pids+=($!); done
sleep 2
echo "busy loops: $BURNERS; RAY_worker_niceness=${RAY_worker_niceness:-(driver default)}; $(uptime)"
start=$(date +%s)
OMP_NUM_THREADS=1 "$PY" -m megatron_dapo.train --hf-checkpoint "$OUT/hf" --prompt-data "$OUT/prompts.jsonl" \
  --rollout-engine hf --num-rollout 1 --rollout-batch-size 2 --n-samples-per-prompt 2 --global-batch-size 4 \
  --micro-batch-size 4 --max-response-length 8 --overlong-buffer-length 2 --overlong-filter false \
  --max-prompt-length 64 --lr 1e-4 --seed 3 --reward-fn tests.e2e.fixtures:parity_reward --reward-num-workers 1 \
  --run-dir "$OUT/run" --wandb-mode disabled --no-progress > "$OUT/driver.txt" 2>&1
rc=$?
echo "driver exit $rc in $(( $(date +%s) - start )) s; $(uptime)"
grep -E '^\[step 1[]/]' "$OUT/driver.txt" | sed 's/.*time/step time/'
exit $rc
