#!/usr/bin/env bash
# Download, into .whl/, the wheels the GPU pass (benchmarks/gpu_check.sh) carries to the H200 machine.
#
#   bash benchmarks/gpu_wheels.sh           # every wheel below: 9 files, 47 MiB; with the repo 49 MiB of 64
#   bash benchmarks/gpu_wheels.sh --list    # print the wheels, one NAME==VERSION a line, and exit
#   bash benchmarks/gpu_wheels.sh --no-bnb  # without bitsandbytes (41 MiB: QLoRA and adamw_8bit are then
#                                           # recorded as unsupported), when the tree has outgrown the carry
#
# That machine (/work/.library/device/KINDS.md) has Python 3.12, torch 2.11, transformers 5.17, peft,
# accelerate, typer, rich, pyyaml, psutil, nvidia-ml-py, msgpack, ninja, py-cpuinfo, einops, numpy,
# tqdm and packaging, and no package index. It lacks, among what the pass imports:
#   deepspeed (ZeRO rows; a pure-Python wheel built here, no compiled ops) and of its requirements
#     hjson and pydantic (pydantic-core, annotated-types, typing-inspection; pydantic 2.14 wants
#     typing-extensions >= 4.16, carried in case the machine's is older);
#   liger-kernel (Triton kernels; triton is there);
#   bitsandbytes (QLoRA's 4-bit base, adamw_8bit; its wheel holds libbitsandbytes_cuda130.so).
# Exactly what the pass uses, nothing more (gpu_check.sh --dry-run lists them and checks .whl/).
# Not carried: flash-attn (PyPI has only its source; building it needs the CUDA toolchain and an
# hour), ray (the pass runs probes as local processes), plotly (report.html only), and optuna (the
# pass compares measured configurations and does not search; `autotune run` there would also need
# optuna 5.0.0 and colorlog, plus sqlalchemy, alembic and mako for its SQLite study).
# Versions: those of this repository's dev environment, so the pass runs what CI tested.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST="$ROOT/.whl"
PY=${PYTHON:-python3}
[ -x "$ROOT/.venv/bin/python" ] && PY=${PYTHON:-$ROOT/.venv/bin/python}

# binary wheels first (must match cp312 manylinux x86_64), then pure ones
BINARY=(
    "pydantic-core==2.50.5"
)
PURE=(
    "hjson==3.1.0"
    "pydantic==2.14.4"
    "annotated-types==0.8.0"
    "typing-inspection==0.4.5"
    "typing-extensions==4.16.0"
    "liger-kernel==0.8.5"
)
BUILT=("deepspeed==0.19.8")   # source only on PyPI: built here with DS_BUILD_OPS=0 (pure Python)
BNB=("bitsandbytes==0.50.2")

WITH_BNB=1
case "${1:-}" in
    --list) printf '%s\n' "${BINARY[@]}" "${PURE[@]}" "${BUILT[@]}" "${BNB[@]}"; exit 0 ;;
    --no-bnb) WITH_BNB=0; rm -f "$DEST"/bitsandbytes-*.whl ;;
    "") ;;
    *) echo "usage: $0 [--list | --no-bnb]" >&2; exit 2 ;;
esac

mkdir -p "$DEST"
grep -qx '/.whl/' "$ROOT/.gitignore" 2>/dev/null || echo "note: add /.whl/ to .gitignore or .git/info/exclude" >&2
PLAT=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_34_x86_64)
PKGS=("${BINARY[@]}" "${PURE[@]}")
[ $WITH_BNB = 1 ] && PKGS+=("${BNB[@]}")
"$PY" -m pip download -q --no-deps --only-binary=:all: "${PLAT[@]}" -d "$DEST" "${PKGS[@]}"
if ! ls "$DEST"/deepspeed-*.whl >/dev/null 2>&1; then
    # setup.py imports torch: build against this environment's torch, no isolation, no ops
    DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "${BUILT[@]}"
fi
# one version of each: two of a name stop the whole install there
dups=$(ls "$DEST"/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z_' 'a-z-' | sort | uniq -d)
[ -n "$dups" ] && { echo "two versions of: $dups (remove the older from $DEST)" >&2; exit 1; }
wheels=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
tree=$(cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | awk '/total$/ {s+=$1} END {print s+0}')
limit=$((64 * 1024 * 1024))
echo "wheels: $(ls "$DEST"/*.whl | wc -l) files, $((wheels / 1024)) KiB; working tree $((tree / 1024)) KiB;" \
     "together $(((wheels + tree) / 1024)) KiB of the 65536 KiB a call carries"
if [ $((wheels + tree)) -gt $limit ]; then
    echo "too large for one carry: drop bitsandbytes (rm $DEST/bitsandbytes-*.whl)" >&2
    exit 1
fi
