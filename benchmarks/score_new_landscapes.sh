#!/usr/bin/env bash
# Score every strategy on the new landscapes F, G, H and I once they are recorded
# (benchmarks/record_new_landscapes.sh), writing benchmarks/results/.
#
#   bash benchmarks/score_new_landscapes.sh              # F, G, H
#   bash benchmarks/score_new_landscapes.sh --held-out   # I alone: ONCE, after the last change to the sampler
#   bash benchmarks/score_new_landscapes.sh --model-held-out   # J, K, L: ONCE, after the model strategy's last change
#   bash benchmarks/score_new_landscapes.sh --model-held-out-2 # M, N, O: ONCE, after the padding-aware speed prior
#   bash benchmarks/score_new_landscapes.sh --model-held-out-3 # P, Q, R: ONCE, after the cost per probe
#   bash benchmarks/score_new_landscapes.sh --model-held-out-4 # S, T, U: ONCE, after the CPU retained heap
#   bash benchmarks/score_new_landscapes.sh --model-held-out-5 # V, W, X: ONCE, after the per-layer memory terms
#
# search_quality.py runs every strategy on each landscape at 15 % of the grid's probes, 30 seeds:
# autotune (--strategy walk), tpe, seed-only, random, largest-micro-batch (largest-fits), deepspeed,
# and the grid-once ceiling, with the unpacked-best reference. It replays the recordings (seconds,
# no probes), so the machine's load does not matter here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
export PYTHONPATH=${PYTHONPATH:-$PWD}
L=benchmarks/landscapes
mkdir -p benchmarks/results
if [ "${1:-}" = "--held-out" ]; then
    files=("$L/cpu-tiny-gpt2-landscape-cpu-i.json")
    tag=heldout-i
elif [ "${1:-}" = "--model-held-out" ]; then
    files=("$L/cpu-tiny-llama-landscape-cpu-j.json" "$L/cpu-tiny-mistral-landscape-cpu-k.json"
           "$L/cpu-tiny-gpt2-landscape-cpu-l.json")
    tag=heldout-jkl
elif [ "${1:-}" = "--model-held-out-2" ]; then
    files=("$L/cpu-tiny-llama-landscape-cpu-m.json" "$L/cpu-tiny-qwen2-landscape-cpu-n.json"
           "$L/cpu-tiny-mistral-landscape-cpu-o.json")
    tag=heldout-mno
elif [ "${1:-}" = "--model-held-out-3" ]; then
    files=("$L/cpu-tiny-gpt2-landscape-cpu-p.json" "$L/cpu-tiny-llama-landscape-cpu-q.json"
           "$L/cpu-tiny-mistral-landscape-cpu-r.json")
    tag=heldout-pqr
elif [ "${1:-}" = "--model-held-out-4" ]; then
    files=("$L/cpu-tiny-qwen2-landscape-cpu-s.json" "$L/cpu-tiny-llama-landscape-cpu-t.json"
           "$L/cpu-tiny-gpt2-landscape-cpu-u.json")
    tag=heldout-stu
elif [ "${1:-}" = "--model-held-out-5" ]; then
    files=("$L/cpu-tiny-mistral-landscape-cpu-v.json" "$L/cpu-tiny-qwen2-landscape-cpu-w.json"
           "$L/cpu-tiny-gpt2-landscape-cpu-x.json")
    tag=heldout-vwx
else
    files=("$L/cpu-tiny-llama-landscape-cpu-f.json" "$L/cpu-tiny-qwen2-landscape-cpu-g.json"
           "$L/cpu-tiny-qwen2-landscape-cpu-h.json")
    tag=new-fgh
fi
for f in "${files[@]}"; do
    [ -f "$f" ] || { echo "$f is not recorded yet: run benchmarks/record_new_landscapes.sh first" >&2; exit 2; }
done
"$PY" benchmarks/search_quality.py "${files[@]}" --seeds 30 --share 0.15 \
    --json "benchmarks/results/search_quality-$tag.json" | tee "benchmarks/results/search_quality-$tag.txt"
if [ "$tag" = heldout-mno ] || [ "$tag" = heldout-pqr ] || [ "$tag" = heldout-stu ] || [ "$tag" = heldout-vwx ]; then  # and the model after the run's first three probes, on the same landscapes
    "$PY" benchmarks/calibration.py "${files[@]}" --seeds 30 --json "benchmarks/results/calibration-$tag.json" \
        | tee "benchmarks/results/calibration-$tag.txt"
fi
