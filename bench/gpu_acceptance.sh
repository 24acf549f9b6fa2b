#!/bin/bash
# Issue 25's acceptance on a GPU machine, in one run (a few minutes): from the
# project root on the device, with the kit of ../shared/tools/gpu-kit.sh in
# .gpukit (heartbeat_sampling_bench copied into .gpukit/tg):
#   bash bench/gpu_acceptance.sh          (results under $OUT, default /tmp/tg-gpu)
# 1. trainguard diag alone: GEMM and copy figures of every GPU;
# 2. a two-rank DDP job (gloo, CUDA tensors, one shared GPU) whose rank 1 GPU is
#    stuck in a long kernel ahead of its collectives: the hang's culprit and
#    attribution in the events, `hang --json` and `report`; GPU gauges in /metrics
#    while it runs; the GPU series' heatmap;
# 3. the issue cost of a journaled NCCL all_reduce (start and end events) against
#    a direct one, and where it goes (journal_event_cost.py);
# 4. the heartbeat's sampling cost with the real NVML.
# With CPU=1 (no GPU) the stall is a host sleep: a dry run of the harness.
set -uo pipefail
OUT=${OUT:-/tmp/tg-gpu}; mkdir -p "$OUT"
ROOT=$PWD; K=$ROOT/.gpukit
if [ "${CPU:-0}" = 1 ]; then
  TG=$ROOT/build/trainguard; PY=/usr/bin/python3; export TRAINGUARD_PY=$ROOT/build/python; CPUFLAG=--cpu
else
  bash "$K/build-core.sh" > "$OUT/build-core.log" 2>&1 || { cat "$OUT/build-core.log"; exit 1; }
  TG=$K/tg/trainguard; PY=$(which python3); export TRAINGUARD_PY=$K/tg/python; CPUFLAG=
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv > "$OUT/nvidia-smi.csv" 2>&1
fi
export TRAINGUARD_PYTHON=$PY
STORE=$OUT/store.db; JOB=gpu-hang-$$
say() { echo "== $*"; }

say "1. trainguard diag (alone)"
timeout 120 "$TG" diag --store "$STORE" --node-id gpunode --json > "$OUT/diag.json" 2> "$OUT/diag.err"
echo "rc=$?"; $PY - "$OUT/diag.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("diag output unreadable:", e); sys.exit()
for n in d["nodes"]:
    print(" node", n["node"], "healthy", n["healthy"], "failures", n["failures"])
    for f in n["figures"]:
        print("   ", {k: v for k, v in f.items()})
PY

say "2. two-rank device hang"
PORT=$((20000 + $$ % 20000))
timeout 240 "$TG" run --nproc-per-node 2 --store "$STORE" --job-id "$JOB" --run-dir "$OUT/run" \
  --hang-timeout 6 --heartbeat-interval 0.5 --gpu-series-interval 1 --stop-grace 2 --no-warm \
  --http 127.0.0.1:$PORT -- "$ROOT/bench/gpu_device_hang.py" $CPUFLAG > "$OUT/job.log" 2>&1 &
JPID=$!
while kill -0 $JPID 2>/dev/null; do
  grep -qs '^trainguard_gpu' "$OUT/metrics.txt" || curl -sf "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics.txt" 2>/dev/null
  grep -qs culprit "$OUT/api-hang.json" || curl -sf "http://127.0.0.1:$PORT/api/v1/hang" > "$OUT/api-hang.json" 2>/dev/null
  sleep 0.5
done
echo "GPU gauges in /metrics:"; grep '^trainguard_gpu' "$OUT/metrics.txt" | head -24
echo "/api/v1/hang while the job ran:"; head -c 800 "$OUT/api-hang.json"; echo
wait $JPID; echo "job rc=$?"
tail -5 "$OUT/job.log"
"$TG" events --store "$STORE" "$JOB" > "$OUT/events.txt" 2>&1
"$TG" events --store "$STORE" --json "$JOB" > "$OUT/events.json" 2>&1
grep -iE "hang|incident|attribut|culprit|decision|restart|job_end|finished|succeeded" "$OUT/events.txt" | cut -c1-400 | head -30
"$TG" hang --store "$STORE" --json "$JOB" > "$OUT/hang.json" 2>&1; echo "hang --json:"; head -c 1500 "$OUT/hang.json"; echo
"$TG" hang --store "$STORE" "$JOB" > "$OUT/hang.txt" 2>&1; head -30 "$OUT/hang.txt"
"$TG" report --store "$STORE" "$JOB" > "$OUT/report.txt" 2>&1; head -40 "$OUT/report.txt"
"$TG" heatmap --store "$STORE" "$JOB" --gpu sm_clock -o "$OUT/gpu-sm-clock.svg" > "$OUT/heatmap.log" 2>&1
echo "heatmap rc=$? $(wc -c < "$OUT/gpu-sm-clock.svg" 2>/dev/null) bytes"
$PY -c "import sqlite3,sys; print('gpu_samples rows, min/max SM MHz, max temp C, max power mW:', sqlite3.connect(sys.argv[1]).execute('select count(*), min(sm_clock_mhz), max(sm_clock_mhz), max(temperature_c), max(power_mw) from gpu_samples').fetchone())" "$STORE"

if [ "${CPU:-0}" != 1 ]; then
  say "3. journaled NCCL all_reduce cost"
  timeout 120 $PY "$ROOT/bench/nccl_journal_check.py" 2>&1 | tail -8
  timeout 150 $PY "$ROOT/bench/journal_event_cost.py" 2>&1 | tail -17
  say "4. heartbeat sampling with the real NVML"
  NVML=$(ldconfig -p | awk '/libnvidia-ml.so.1 /{print $NF; exit}')
  timeout 120 "$K/tg/heartbeat_sampling_bench" --heartbeats 300 --nvml "${NVML:-libnvidia-ml.so.1}" 2>&1 | tail -6
fi
say done
