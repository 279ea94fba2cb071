#!/usr/bin/env bash
# Record landscapes F, G, H and (last) I for benchmarks/search_quality.py, and J, K, L, then M, N, O, then P, Q, R,
# then S, T, U, then V, W, X: the model strategy's held-out sets (each recorded after its last change, scored once:
# score_new_landscapes.sh --model-held-out for J K L, --model-held-out-2 for M N O, --model-held-out-3 for P Q R,
# --model-held-out-4 for S T U, held out for the CPU memory model's retained heap, --model-held-out-5 for V W X,
# held out for the strategy as it stands after the memory model's per-layer terms).
#
#   bash benchmarks/record_new_landscapes.sh [F G H I]     # default: F G H I, I last
#   bash benchmarks/record_new_landscapes.sh J K L
#   bash benchmarks/record_new_landscapes.sh M N O
#   bash benchmarks/record_new_landscapes.sh P Q R
#   bash benchmarks/record_new_landscapes.sh S T U
#   bash benchmarks/record_new_landscapes.sh V W X
#
# Run it on a QUIET machine (nothing else on the cores: CPU timings under other load are noise),
# from the repository root, with autotune's venv active (or PY=/path/to/python). Each landscape
# is 24 configurations x 2 repeats. Sizing: one probe took 17-39 s (F 39, G 17, H 40, I 17) on the
# busy 2-core machine of 2026-11-30 (several agents' work), and C's probes of F's size took 9-15 s
# recorded quietly; so one landscape takes ~8-12 minutes quietly (H the longest). Rerunning resumes (finished repeats are kept).
#
# THE BUDGET RULE, fixed before anything is recorded: every configuration is first measured under
# a 64 GiB probe ceiling (nothing is cut short by memory); the landscape's budget is then the median,
# over its configurations, of their peak memory (the largest of their repeats), divided by
# (1 - headroom) = 0.95 and rounded up to a whole MiB -- so the usable memory equals the median peak
# and about half of the configurations are over budget. The second record_landscape call only
# relabels the entries under that budget (no probe runs: every configuration has its repeats).
#
# What each one is (search_spaces/landscape-cpu-*.yaml says more):
#   F  tiny-llama, fixed-length 256-token sequences (packing cannot win), micro-batch 4..16,
#      checkpointing, eager/sdpa, packing                                     (24 configurations)
#   G  tiny-qwen2, LoRA, lognormal lengths, micro-batch 4..16, checkpointing, fp32/bf16, packing  (24)
#   H  tiny-qwen2, 1024-token sequences, effective batch 4, micro-batch 1..4, checkpointing,
#      eager/sdpa, fp32/bf16; 3 timed steps (a probe is 2x the tokens of F's)  (24)
#   I  tiny-gpt2 (learned positions, another shape), lognormal lengths, micro-batch 4..16,
#      checkpointing, eager/sdpa, packing  -- the HELD-OUT landscape: record it last, do not
#      open it or score it before the last change to the sampler (score_new_landscapes.sh --held-out)
#   J  tiny-llama, LoRA, 512-token fixed-length sequences, effective batch 8, micro-batch 1..8,
#      checkpointing, eager/sdpa, fp32/bf16                                  (32)
#   K  tiny-mistral, lognormal lengths, micro-batch 4..16, checkpointing, packing, AdamW plain/fused  (24)
#   L  tiny-gpt2, LoRA, lognormal(4.5, 0.8) lengths up to 384, effective batch 8, micro-batch 2..8,
#      checkpointing, fp32/bf16, packing                                     (24)
#   M  tiny-llama, LoRA, uniform 32-512 lengths, effective batch 16, micro-batch 2..8, checkpointing,
#      eager/sdpa, packing                                                   (24)
#   N  tiny-qwen2, lognormal(5.0, 0.7) lengths up to 512, effective batch 8, micro-batch 2..8,
#      checkpointing, fp32/bf16, packing                                     (24)
#   O  tiny-mistral, LoRA, 384-token fixed-length sequences, effective batch 8, micro-batch 2..8,
#      checkpointing, eager/sdpa, AdamW plain/fused                          (24)
#   P  tiny-gpt2, LoRA, uniform 64-512 lengths, effective batch 16, micro-batch 2..8, checkpointing,
#      fp32/bf16, packing                                                    (24)
#   Q  tiny-llama, lognormal(4.5, 0.9) lengths up to 384, effective batch 8, micro-batch 1..4,
#      checkpointing, eager/sdpa, packing                                    (24)
#   R  tiny-mistral, 256-token fixed-length sequences, effective batch 32, micro-batch 4..16,
#      checkpointing, eager/sdpa, fp32/bf16                                  (24)
#   S  tiny-qwen2, LoRA, 384-token fixed-length sequences, effective batch 16, micro-batch 2..8,
#      checkpointing, eager/sdpa, fp32/bf16                                  (24)
#   T  tiny-llama, uniform 64-384 lengths, effective batch 16, micro-batch 4..16, checkpointing,
#      eager/sdpa, packing                                                   (24)
#   U  tiny-gpt2, 512-token fixed-length sequences, effective batch 8, micro-batch 2..8, checkpointing,
#      fp32/bf16, AdamW plain/fused                                          (24)
#   V  tiny-mistral, LoRA, 512-token fixed-length sequences, effective batch 16, micro-batch 1..4,
#      checkpointing, eager/sdpa, AdamW plain/fused                          (24)
#   W  tiny-qwen2, lognormal(4.8, 0.8) lengths up to 512, effective batch 16, micro-batch 2..8,
#      checkpointing, eager/sdpa, packing                                    (24)
#   X  tiny-gpt2, LoRA, uniform 64-256 lengths, effective batch 32, micro-batch 4..16, checkpointing,
#      fp32/bf16, packing                                                    (24)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
export PYTHONPATH=${PYTHONPATH:-$PWD}

budget_by_rule() {  # LANDSCAPE.json -> "<N>MiB" (the rule above: record_landscape.median_budget_text)
    "$PY" -c 'import json, sys; sys.path.insert(0, "benchmarks"); from record_landscape import median_budget_text
print(median_budget_text(json.load(open(sys.argv[1]))))' "$1"
}

record() {  # NAME MODEL SEQ_LEN LENGTHS EFFECTIVE_BATCH MODE STEPS
    local name=$1 model=$2 seq=$3 lengths=$4 eb=$5 mode=$6 steps=$7
    local space="landscape-cpu-${name,,}"
    local args=(--model "$model" --space "$space" --device cpu --seq-len "$seq" --lengths "$lengths"
                --effective-batch "$eb" --mode "$mode" --threads 1 --repeats 2 --steps "$steps" --warmup 1)
    local out="benchmarks/landscapes/cpu-${model}-${space}.json"
    echo "== landscape $name: $model $space ($(date -u +%H:%M:%S))"
    "$PY" benchmarks/record_landscape.py "${args[@]}" --gpu-budget 64GiB
    local budget
    budget=$(budget_by_rule "$out")
    echo "== landscape $name: budget by the rule: $budget"
    "$PY" benchmarks/record_landscape.py "${args[@]}" --gpu-budget "$budget"
}

todo=("$@")
[ ${#todo[@]} -eq 0 ] && todo=(F G H I)
for n in "${todo[@]}"; do
    case "$n" in
        F) record F tiny-llama 256 fixed 16 full 5 ;;
        G) record G tiny-qwen2 256 lognormal:4.0,1.0 16 lora 5 ;;
        H) record H tiny-qwen2 1024 fixed 4 full 3 ;;
        I) record I tiny-gpt2 256 lognormal:4.0,1.0 16 full 5 ;;
        J) record J tiny-llama 512 fixed 8 lora 5 ;;
        K) record K tiny-mistral 256 lognormal:4.0,1.0 16 full 5 ;;
        L) record L tiny-gpt2 384 lognormal:4.5,0.8 8 lora 5 ;;
        M) record M tiny-llama 512 uniform:32-512 16 lora 5 ;;
        N) record N tiny-qwen2 512 lognormal:5.0,0.7 8 full 5 ;;
        O) record O tiny-mistral 384 fixed 8 lora 5 ;;
        P) record P tiny-gpt2 512 uniform:64-512 16 lora 5 ;;
        Q) record Q tiny-llama 384 lognormal:4.5,0.9 8 full 5 ;;
        R) record R tiny-mistral 256 fixed 32 full 5 ;;
        S) record S tiny-qwen2 384 fixed 16 lora 5 ;;
        T) record T tiny-llama 384 uniform:64-384 16 full 5 ;;
        U) record U tiny-gpt2 512 fixed 8 full 5 ;;
        V) record V tiny-mistral 512 fixed 16 lora 5 ;;
        W) record W tiny-qwen2 512 lognormal:4.8,0.8 16 full 5 ;;
        X) record X tiny-gpt2 256 uniform:64-256 32 lora 5 ;;
        *) echo "unknown landscape $n (F to X)" >&2; exit 2 ;;
    esac
done
