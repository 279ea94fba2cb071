#!/usr/bin/env bash
# The one GPU pass: every GPU figure the README's claims need, in one command of at most 10 minutes
# on a lent single-GPU machine (an H200 with torch, transformers, peft and accelerate, no package
# index: what else it needs travels as wheels in .whl/, see benchmarks/gpu_wheels.sh).
#
#   bash benchmarks/gpu_check.sh OUT_DIR            # the H200 pass: llama-3.2-1b, seq 2048, bf16
#   bash benchmarks/gpu_check.sh --dry-run OUT_DIR  # print the plan (steps, caps, expected s, wheels); run nothing
#   bash benchmarks/gpu_check.sh --cpu OUT_DIR      # every step's code path on CPU, tiny-llama, tiny caps
#
# Steps run in order of value per second, each under a cap; the caps sum to the total, and a step
# that ends early leaves its time to the next ones (step k must end by the sum of caps 1..k). A
# step cut by its cap is ended with every process it started, probes in their own sessions
# included (benchmarks/_capped.sh), so no orphan trains on during the next step. Every figure is
# written under OUT_DIR as it lands; at most 8 files, all directly in OUT_DIR:
#   summary.txt       the plan, then one line per step (ok / TIMED OUT / FAILED / skipped, seconds)
#   gpu_check.log     everything the steps printed (the GPU test tier's output included)
#   rows.jsonl        every probe row of every step, one JSON object a line, "step" naming the step
#   environment.json  versions, device, driver, which optional packages import, NVML self-check
#   estimator.json    memory estimator vs GPU probes, and CUDA_CONTEXT_BYTES / ALLOCATOR_RESERVE fitted
#   spread.json       3 repeats of 2 configurations: per-config tok/s and relative spread
#   fidelity.json     probe vs a plain Trainer process running the emitted files (benchmarks/fidelity.py)
#   landscape.json    a bounded, shuffled landscape of search_spaces/landscape-gpu-1b.yaml
set -u

usage() { echo "usage: $0 [--dry-run | --cpu] OUT_DIR" >&2; exit 2; }
MODE=gpu
OUT_ARG=""
for arg in "$@"; do
    case "$arg" in
        --dry-run) MODE=dry ;;
        --cpu) MODE=cpu ;;
        -*) usage ;;
        *) [ -n "$OUT_ARG" ] && usage; OUT_ARG=$arg ;;
    esac
done
[ -z "$OUT_ARG" ] && usage
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=benchmarks/_capped.sh
source "$ROOT/benchmarks/_capped.sh"
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY=python3; fi

# --- the plan: name | cap (s) on the GPU | expected (s) on the GPU | cap (s) in --cpu mode | what ---------
# Expected seconds are estimates, not measurements (no pass has run yet): ~18 s per llama-3.2-1b
# probe process at seq 2048 (imports ~8 s, build, 2+5 steps), ~10 s per tiny/small-model probe.
PLAN=(
    "wheels|20|12|5|install .whl/*.whl into a temporary folder on PYTHONPATH (pip --no-index --no-deps)"
    "environment|10|6|25|versions, device, driver, importable packages, NVML self-check -> environment.json"
    "estimator|100|85|45|memory estimator vs 26 GPU probes (4 at once), GPU constants fitted -> estimator.json"
    "spread|95|90|70|2 configurations x 3 repeats of the 1B model, interleaved -> spread.json"
    "fidelity|65|60|50|probe vs a plain Trainer process of the emitted files (fidelity.py) -> fidelity.json"
    "warm|40|35|30|fresh vs forked probe processes of tiny-llama, pairs until the cap (warm_start.py) -> rows.jsonl"
    "composition|40|35|30|short probe vs whole steps at accumulation 8: composed tok/s and peak (composition.py) -> rows.jsonl"
    "zero|40|40|45|ZeRO-2/3 and offload under DeepSpeed and FSDP, by value, until the cap -> rows.jsonl"
    "levers|65|65|55|sdpa vs eager (+ flash-attn), packing on long-tail lengths, the default CUDA allocator, liger, QLoRA, MFU -> rows.jsonl"
    "tuned|45|40|40|the fastest config measured in this pass vs the HF default at the same precision"
    "landscape|15|15|30|a shuffled bounded landscape of landscape-gpu-1b (a random sample) -> landscape.json"
    "pytest|35|35|30|the GPU test tier, pytest -m gpu, over the files that hold gpu-marked tests"
)
if [ $MODE = cpu ]; then
    MODEL=tiny-llama; DEVICE=cpu; SEQ=64; EB=4; MB=2; PREC=fp32; WARMUP=1; STEPS=2; THREADS=1
    PROBE_TIMEOUT=120; PROBE_S=20; REPEATS=2; EST="--only llama-s128-b1"; EST_JOBS=1
    SPACE=landscape-cpu-a; LAND_BUDGET=200MiB; LONG="lognormal:3.5,1.0"; ZERO_SHARDING=fsdp
    ZERO_ARGS="--dry-run"
else
    MODEL=llama-3.2-1b; DEVICE=cuda; SEQ=2048; EB=16; MB=4; PREC=bf16; WARMUP=2; STEPS=5; THREADS=0
    PROBE_TIMEOUT=150; PROBE_S=30; REPEATS=3; EST=""; EST_JOBS=4
    SPACE=landscape-gpu-1b; LAND_BUDGET=40GB; LONG="lognormal:5.0,1.0"; ZERO_SHARDING=both
    ZERO_ARGS="--model $MODEL --seq-len $SEQ --micro-batch $MB --steps $STEPS --warmup $WARMUP --timeout $PROBE_TIMEOUT"
fi
TOTAL=0
for entry in "${PLAN[@]}"; do
    IFS='|' read -r _ gcap _ ccap _ <<<"$entry"
    TOTAL=$((TOTAL + $([ $MODE = cpu ] && echo "$ccap" || echo "$gcap")))
done

print_plan() {
    local i=0 name gcap exp ccap what cap sum=0 esum=0
    echo "gpu_check plan ($([ $MODE = cpu ] && echo "--cpu: $MODEL on cpu" || echo "GPU: $MODEL seq $SEQ $PREC"))," \
         "total ${TOTAL}s; a step ends by the sum of the caps up to it; order = value per second"
    printf '  %-2s %-12s %6s %10s  %s\n' "#" step cap_s expected_s what
    for entry in "${PLAN[@]}"; do
        IFS='|' read -r name gcap exp ccap what <<<"$entry"
        i=$((i + 1))
        cap=$([ $MODE = cpu ] && echo "$ccap" || echo "$gcap")
        [ $MODE = cpu ] && exp="-"
        sum=$((sum + cap)); [ "$exp" != "-" ] && esum=$((esum + exp))
        printf '  %-2s %-12s %6s %10s  %s\n' "$i" "$name" "$cap" "$exp" "$what"
    done
    printf '     %-12s %6s %10s\n' "total" "$sum" "$([ $MODE = cpu ] && echo - || echo $esum)"
}

print_wheels() {
    local want have missing=0 w
    echo "wheels to carry (.whl/, made by: bash benchmarks/gpu_wheels.sh):"
    while read -r want; do
        w=$(echo "${want%%==*}" | tr '-' '_')  # wheel file names spell the name with underscores
        have=$(cd "$ROOT" && ls .whl/ 2>/dev/null | grep -ic "^${w}-${want##*==}-")
        [ "$have" -gt 0 ] && echo "  $want  (in .whl/)" || { echo "  $want  (MISSING from .whl/)"; missing=1; }
    done < <(bash "$ROOT/benchmarks/gpu_wheels.sh" --list)
    echo "  not carried: flash-attn (no wheel on PyPI), ray (local probes), optuna (no search in the pass), plotly"
    local tree wheels
    tree=$(git ls-files -co --exclude-standard -z 2>/dev/null | xargs -0 du -cb 2>/dev/null | awk '/total$/ {s+=$1} END {print s+0}')
    wheels=$(du -cb .whl/*.whl 2>/dev/null | tail -1 | cut -f1); wheels=${wheels:-0}
    echo "  size: working tree $((tree / 1024)) KiB + wheels $((wheels / 1024)) KiB = $(((tree + wheels) / 1024)) KiB" \
         "of the 65536 KiB one device call carries"
    echo "device call: run(command='bash benchmarks/gpu_check.sh \$OUT', carry=['.whl'], timeout_s=600)"
    return $missing
}

if [ $MODE = dry ]; then
    OUT=$(mkdir -p "$OUT_ARG" && cd "$OUT_ARG" && pwd)
    { print_plan; print_wheels; } | tee "$OUT/plan.txt"
    exit 0
fi

OUT=$(mkdir -p "$OUT_ARG" && cd "$OUT_ARG" && pwd)
LOG="$OUT/gpu_check.log"; SUMMARY="$OUT/summary.txt"; ROWS="$OUT/rows.jsonl"
: >"$LOG"; : >"$SUMMARY"; : >"$ROWS"
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
START=$SECONDS
DEADLINE=$START
note() { echo "$*" | tee -a "$SUMMARY" >&2; }
print_plan >>"$SUMMARY"
note "gpu_check $(date -u +%FT%TZ) mode=$MODE model=$MODEL device=$DEVICE seq=$SEQ python=$PY out=$OUT"

# cap_of NAME -> this mode's cap of that step
cap_of() {
    local entry name gcap ccap
    for entry in "${PLAN[@]}"; do
        IFS='|' read -r name gcap _ ccap _ <<<"$entry"
        [ "$name" = "$1" ] && { [ $MODE = cpu ] && echo "$ccap" || echo "$gcap"; return; }
    done
}

# step NAME CMD...: run CMD until this step's deadline (the sum of the caps so far), log it, note it
BUDGET=0
CURRENT=""
begin() {  # NAME -> sets BUDGET (seconds this step may use; <= 0: none left)
    CURRENT=$1
    DEADLINE=$((DEADLINE + $(cap_of "$1")))
    BUDGET=$((DEADLINE - SECONDS))
}
step() {
    local name=$1; shift
    if [ "$BUDGET" -lt 5 ]; then
        note "$name: skipped (the pass is ${BUDGET#-}s $([ "$BUDGET" -lt 0 ] && echo behind || echo from) its plan)"
        return 0
    fi
    local t0=$SECONDS rc
    echo "=== $name (until +$((DEADLINE - START))s, ${BUDGET}s) $(date -u +%FT%TZ): $*" >>"$LOG"
    run_capped "$BUDGET" "$LOG" "$@"
    rc=$?
    if [ $rc = 0 ]; then note "$name: ok in $((SECONDS - t0))s"
    elif [ $rc = 124 ]; then note "$name: TIMED OUT after ${BUDGET}s (what it wrote is kept; its processes ended)"
    else note "$name: FAILED rc=$rc in $((SECONDS - t0))s (see gpu_check.log)"; fi
    return 0
}
# seconds a step that loops over probes may keep starting them: its budget less one probe (in --cpu
# mode its own cap, not the time earlier steps left: the CI test of this mode stays short)
box() {
    local b=$BUDGET
    [ $MODE = cpu ] && [ "$(cap_of "$CURRENT")" -lt "$b" ] && b=$(cap_of "$CURRENT")
    b=$((b - PROBE_S)); [ $b -lt 1 ] && b=1; echo $b
}
WL=(--model "$MODEL" --device "$DEVICE" --seq-len "$SEQ" --effective-batch "$EB" --micro-batch "$MB"
    --precision "$PREC" --warmup "$WARMUP" --steps "$STEPS" --threads "$THREADS" --timeout "$PROBE_TIMEOUT")

# 1. wheels carried in the tree
begin wheels
SITE="$WORK/site"
shopt -s nullglob; WHEELS=("$ROOT"/.whl/*.whl); shopt -u nullglob
if [ $MODE = cpu ]; then
    note "wheels: not installed in --cpu mode (this environment has the packages; the wheels are cp312)"
elif [ ${#WHEELS[@]} -gt 0 ]; then
    step "wheels (${#WHEELS[@]})" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target "$SITE" "${WHEELS[@]}"
else
    note "wheels: none in .whl/ (run benchmarks/gpu_wheels.sh): optuna, deepspeed, liger, bitsandbytes rows are skipped"
fi
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

# 2. environment
begin environment
step environment "$PY" benchmarks/gpu_pass.py environment --device "$DEVICE" --out "$OUT/environment.json"

# 3. estimator constants: what the memory cap of every probe rests on
begin estimator
# shellcheck disable=SC2086
step estimator "$PY" benchmarks/estimator_accuracy.py --device "$DEVICE" $EST --jobs "$EST_JOBS" \
    --out "$OUT/estimator.json" --jsonl "$ROWS"

# 4. spread of repeated probes (the confirmation tolerance is set from it)
begin spread
step spread "$PY" benchmarks/gpu_pass.py spread "${WL[@]}" --repeats "$REPEATS" --time-box "$(box)" \
    --jsonl "$ROWS" --out "$OUT/spread.json"

# 5. fidelity: the probe's tok/s and memory vs a plain Trainer process running the emitted files
begin fidelity
if [ -f benchmarks/fidelity.py ]; then
    step fidelity "$PY" benchmarks/fidelity.py --model "$MODEL" --device "$DEVICE" --seq-len "$SEQ" \
        --micro-batch "$MB" --grad-accum $((EB / MB)) --precision "$PREC" --repeats 2 --json-out "$OUT/fidelity.json"
else
    note "fidelity: skipped (benchmarks/fidelity.py is not in this tree)"
fi

# 5b. the warm start on this device: does a probe forked from a warm server measure what a fresh one does,
# and how much of its set-up does the fork save (autotune run forks CPU probes only until this says so)
begin warm
if [ -f benchmarks/warm_start.py ]; then
    WARM_BOX=$BUDGET  # pairs start until 15 s (a tiny probe's pair) before the cap; in --cpu mode its own cap
    [ $MODE = cpu ] && [ "$(cap_of warm)" -lt "$WARM_BOX" ] && WARM_BOX=$(cap_of warm)
    WARM_BOX=$((WARM_BOX - 15)); [ $WARM_BOX -lt 1 ] && WARM_BOX=1
    step warm "$PY" benchmarks/warm_start.py --model tiny-llama --device "$DEVICE" --precision "$PREC" \
        --seq-len $([ $MODE = cpu ] && echo 64 || echo 512) --micro-batch $([ $MODE = cpu ] && echo 2 || echo 8) \
        --warmup "$WARMUP" --steps "$STEPS" --timeout "$PROBE_TIMEOUT" --repeats 3 --time-box "$WARM_BOX" --jsonl "$ROWS"
else
    note "warm: skipped (benchmarks/warm_start.py is not in this tree)"
fi

# 6. the short probe's composition: composed at accumulation 8 vs whole steps at 8, same configuration
begin composition
step composition "$PY" benchmarks/composition.py --device "$DEVICE" --model "$MODEL" --seq-len "$SEQ" \
    --micro-batch "$MB" --grad-accum 8 --precision "$PREC" --repeats 1 --steps "$STEPS" --warmup-steps "$WARMUP" \
    --timeout "$PROBE_TIMEOUT" --jsonl "$ROWS"

# 6b. ZeRO stages and offload, DeepSpeed and FSDP (rows by value, until the cap)
begin zero
# shellcheck disable=SC2086
step zero "$PY" benchmarks/gpu_zero_stages.py "$WORK/zero_stages.json" $ZERO_ARGS --sharding "$ZERO_SHARDING" \
    --order pass --time-box "$(box)" --jsonl "$ROWS"

# 7. levers: attention, packing on a long tail, liger, QLoRA; MFU of each
begin levers
step levers "$PY" benchmarks/gpu_pass.py levers "${WL[@]}" --lengths "$LONG" --time-box "$(box)" --jsonl "$ROWS"

# 8. tuned vs the HF default at the same precision
begin tuned
step tuned "$PY" benchmarks/gpu_pass.py tuned "${WL[@]}" --jsonl "$ROWS"

# 9. a bounded landscape (shuffled: a recording cut short is a random sample)
begin landscape
step landscape "$PY" benchmarks/record_landscape.py --model "$MODEL" --space "$SPACE" --device "$DEVICE" \
    --seq-len "$SEQ" --effective-batch "$EB" --gpu-budget "$LAND_BUDGET" --repeats 1 --shuffle \
    --time-box "$(box)" --timeout "$PROBE_TIMEOUT" --warmup "$WARMUP" --steps "$STEPS" --threads "$THREADS" \
    --out "$OUT/landscape.json"

# 10. the GPU test tier (exit 5, no test selected, is not a failure)
begin pytest
GPU_TESTS=$(grep -l "mark.gpu" tests/test_*.py 2>/dev/null | tr '\n' ' ')
if ! "$PY" -c "import pytest" 2>/dev/null; then
    note "pytest: skipped (pytest is not installed)"
elif [ -z "$GPU_TESTS" ]; then
    note "pytest: skipped (no test file holds a gpu-marked test)"
else
    # shellcheck disable=SC2086
    step pytest bash -c "'$PY' -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS; rc=\$?; [ \$rc = 5 ] && rc=0; exit \$rc"
fi

rm -rf "$WORK"
n=$(ls "$OUT" | wc -l)
note "done in $((SECONDS - START))s of ${TOTAL}s; $(wc -l <"$ROWS") rows in rows.jsonl; $n files: $(cd "$OUT" && ls | tr '\n' ' ')"
[ "$n" -le 8 ] || note "WARNING: more than 8 files in $OUT: the device call returns 8 at most"
exit 0
