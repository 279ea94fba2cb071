#!/usr/bin/env bash
# One pass of every GPU check, in at most 10 minutes, on a single-GPU machine without a package index.
#
#   bash benchmarks/gpu_check.sh OUT_DIR            # the H200 pass (llama-3.2-1b, seq 2048)
#   bash benchmarks/gpu_check.sh OUT_DIR --dry-run  # the same code paths on CPU, tiny-llama, a few minutes
#
# The machine has torch, transformers, peft, accelerate and nvidia-ml-py but no optuna and no ray,
# so nothing here needs them: probes run as local subprocesses (LocalExecutor / run_probe_process),
# and "tuned" is the best configuration of the landscape recorded in this pass (the Optuna
# searcher is scored against recorded landscapes elsewhere: benchmarks/search_quality.py).
#
# Steps (each time-boxed; a step that fails or runs out of time is recorded and the pass goes on):
#   0. wheels carried in the working tree (.whl/*.whl, e.g. pytest, optuna) are installed with
#      `pip install --no-index --no-deps --target` into a temporary folder on PYTHONPATH;
#   1. environment fingerprint                          -> environment.json
#   2. the GPU test tier, `pytest -m gpu`                -> pytest_gpu.txt
#   3. a bounded landscape (landscape-gpu-1b.yaml)      -> landscape.json
#   4. tuned (landscape best) vs HF default, tok/s, MFU -> tuned_vs_default.json
#   5. benchmarks/gpu_zero_stages.py                    -> zero_stages.json
#   6. benchmarks/estimator_accuracy.py --device cuda   -> estimator_accuracy.json (when present)
#   and the log of the whole pass                       -> gpu_check.log, one line per step -> summary.txt
# At most 8 files, all directly in OUT_DIR.
set -u

if [ $# -lt 1 ] || [ "${1:0:1}" = "-" ]; then
    echo "usage: $0 OUT_DIR [--dry-run]" >&2
    exit 2
fi
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
DRY=0
[ "${2:-}" = "--dry-run" ] && DRY=1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY=python3; fi
LOG="$OUT/gpu_check.log"
SUMMARY="$OUT/summary.txt"
: >"$LOG"
: >"$SUMMARY"
START=$SECONDS
TOTAL=${GPU_CHECK_SECONDS:-590}

if [ $DRY = 1 ]; then
    MODEL=tiny-llama; DEVICE=cpu; SEQ=64; EB=4; BUDGET=200MiB; SPACE=landscape-cpu-a
    BOX=25; PROBE_TIMEOUT=120; STEPS=2; THREADS="--threads 1"; ZERO="--dry-run --sharding fsdp"
    EST_ARGS="--device cpu --only llama-s128-b1"; PYTEST_FILTER="-m gpu"
else
    MODEL=llama-3.2-1b; DEVICE=cuda; SEQ=2048; EB=16; BUDGET=40GB; SPACE=landscape-gpu-1b
    BOX=150; PROBE_TIMEOUT=150; STEPS=5; THREADS=""; ZERO=""
    EST_ARGS="--device cuda"; PYTEST_FILTER="-m gpu"
fi

left() { echo $((TOTAL - (SECONDS - START))); }
note() { echo "$*" | tee -a "$SUMMARY" >&2; }
# step NAME SECONDS CMD...: run CMD with a timeout (never more than what is left), log it, note the outcome
step() {
    local name=$1 budget=$2; shift 2
    local remaining; remaining=$(left)
    if [ "$remaining" -lt 20 ]; then
        note "$name: skipped (only ${remaining}s of the ${TOTAL}s pass left)"
        return 0
    fi
    [ "$budget" -gt "$remaining" ] && budget=$remaining
    local t0=$SECONDS rc
    echo "=== $name (timeout ${budget}s) $(date -u +%FT%TZ): $*" >>"$LOG"
    timeout --kill-after=10 "$budget" "$@" >>"$LOG" 2>&1
    rc=$?
    if [ $rc = 0 ]; then note "$name: ok in $((SECONDS - t0))s"
    elif [ $rc = 124 ] || [ $rc = 137 ]; then note "$name: TIMED OUT after ${budget}s (what it wrote is kept)"
    else note "$name: FAILED rc=$rc in $((SECONDS - t0))s (see gpu_check.log)"; fi
    return 0
}

note "gpu_check $(date -u +%F) mode=$([ $DRY = 1 ] && echo dry-run || echo gpu) model=$MODEL device=$DEVICE seq=$SEQ python=$PY"

# 0. wheels carried in the tree
SITE=$(mktemp -d /tmp/autotune-site.XXXXXX)
shopt -s nullglob
WHEELS=("$ROOT"/.whl/*.whl)
shopt -u nullglob
if [ ${#WHEELS[@]} -gt 0 ]; then
    step "wheels (${#WHEELS[@]})" 120 "$PY" -m pip install --no-index --no-deps --quiet --target "$SITE" "${WHEELS[@]}"
else
    note "wheels: none in .whl/"
fi
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"

# 1. environment
step environment 60 "$PY" -c "
import json, sys
from autotune.env import fingerprint
fp = fingerprint('$DEVICE')
fp['optuna'] = __import__('importlib.util').util.find_spec('optuna') is not None
fp['ray'] = __import__('importlib.util').util.find_spec('ray') is not None
json.dump(fp, open(sys.argv[1], 'w'), indent=1, default=str)
" "$OUT/environment.json"

# 2. GPU test tier: only the files that hold gpu-marked tests are collected (the others may import
#    optuna or ray, which this machine lacks); exit 5 (no test selected) is not a failure
GPU_TESTS=$(grep -l "mark.gpu" tests/test_*.py 2>/dev/null | tr '\n' ' ')
if ! "$PY" -c "import pytest" 2>/dev/null; then
    note "pytest -m gpu: skipped (pytest is not installed and no wheel of it is in .whl/)"
    echo "pytest not installed" >"$OUT/pytest_gpu.txt"
elif [ -z "$GPU_TESTS" ]; then
    note "pytest -m gpu: no test file holds a gpu-marked test"
    echo "no gpu-marked tests" >"$OUT/pytest_gpu.txt"
else
    step "pytest -m gpu" 120 bash -c "'$PY' -m pytest -q -p no:cacheprovider $PYTEST_FILTER $GPU_TESTS >'$OUT/pytest_gpu.txt' 2>&1; rc=\$?; [ \$rc = 5 ] && rc=0; exit \$rc"
fi

# 3. a bounded landscape (shuffled order, time-boxed: a cut-short recording is a random sample)
LAND="$OUT/landscape.json"
step landscape $((BOX + PROBE_TIMEOUT + 30)) "$PY" benchmarks/record_landscape.py --model "$MODEL" --space "$SPACE" \
    --device "$DEVICE" --seq-len "$SEQ" --effective-batch "$EB" --gpu-budget "$BUDGET" --repeats 1 --shuffle \
    --time-box "$BOX" --timeout "$PROBE_TIMEOUT" --steps "$STEPS" $THREADS --out "$LAND"

# 4. tuned (best of the landscape) vs the HF default (hf_default_candidate, made to fit), re-measured
step "tuned vs HF default" $((3 * PROBE_TIMEOUT)) "$PY" - "$LAND" "$OUT/tuned_vs_default.json" "$MODEL" "$DEVICE" "$STEPS" "${THREADS#--threads }" <<'EOF'
import dataclasses, json, sys, time
from autotune.diagnose import probe_mfu
from autotune.emit.training_args import hf_default_candidate
from autotune.executors.local import run_probe_process
from autotune.executors.replay import load_landscape
from autotune.models import resolve_model
from autotune.search import candidate_label
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.store.atomic import write_json_atomic

land_path, out, model, device, steps, threads = sys.argv[1:7]
land = load_landscape(land_path)
ok = [e for e in land["entries"] if e.get("status") == "ok" and e.get("tokens_per_s")]
record = {"date": time.strftime("%Y-%m-%d"), "landscape": land_path, "measured": len(ok)}
if not ok:
    record["problem"] = "no configuration of the landscape fits (or none was recorded in time)"
    write_json_atomic(out, record)
    sys.exit(1)
resolved = resolve_model(model)
wl = Workload(model=resolved.name, model_path=resolved.path, seq_len=int(land["seq_len"]), lengths=land.get("lengths", "fixed"))
st = ProbeSettings(device=device, budget_bytes=int(land["budget_bytes"]), warmup_steps=2, steps=2 * int(steps),
                   timeout_s=float(land.get("timeout_s") or 300), cpu_threads=int(threads) if threads else None)
tuned = Candidate(**max(ok, key=lambda e: e["tokens_per_s"])["candidate"])
default = hf_default_candidate(int(land["effective_batch"]))

def measure(c):
    r = run_probe_process(ProbeRequest(workload=wl, candidate=c, settings=st))
    return r, {"label": candidate_label(c), "candidate": dataclasses.asdict(c), "status": r.status,
               "reason": r.reason[:300], "tokens_per_s": r.tokens_per_s, "peak_mem_bytes": r.peak_mem_bytes,
               "mfu": probe_mfu(r, resolved.config) if r.status == "ok" else None}

_, record["tuned"] = measure(tuned)
record["tuned"]["landscape_tokens_per_s"] = max(e["tokens_per_s"] for e in ok)
write_json_atomic(out, record)
r, record["hf_default"] = measure(default)
if r.status in ("oom", "over_budget"):  # made to fit: checkpointing, as a user would add it
    record["hf_default_plain"] = record["hf_default"]
    r, record["hf_default"] = measure(dataclasses.replace(default, grad_ckpt=True))
a, b = record["tuned"].get("tokens_per_s"), record["hf_default"].get("tokens_per_s")
record["speedup"] = a / b if a and b and record["hf_default"]["status"] == "ok" else None
write_json_atomic(out, record)
print(json.dumps({k: record[k] for k in ("speedup",)}), record["tuned"]["label"], "vs", record["hf_default"]["label"])
EOF

# 5. ZeRO stages on one GPU (FSDP stands in where deepspeed is missing)
step "zero stages" 150 "$PY" benchmarks/gpu_zero_stages.py "$OUT/zero_stages.json" $ZERO

# 6. estimator accuracy on this device
if [ -f benchmarks/estimator_accuracy.py ]; then
    step "estimator accuracy" 120 "$PY" benchmarks/estimator_accuracy.py $EST_ARGS --out "$OUT/estimator_accuracy.json"
else
    note "estimator accuracy: benchmarks/estimator_accuracy.py not present"
fi

rm -rf "$SITE"
note "done in $((SECONDS - START))s; files: $(cd "$OUT" && ls | tr '\n' ' ')"
exit 0
