"""How far TRL's packing moves the loss, next to autotune's own (the quality note of ``--trainer trl``).

    python benchmarks/trl_packing_loss.py [--steps 20] [--rows 64] [--out benchmarks/results/trl_packing_loss.json]

Runs the ``--verify-loss`` pair (``autotune.run._verify.verify_requests``: no warm-up, no budget, same seed)
for two chosen configurations against the HF default (micro-batch 8, fp32, sdpa, unpacked) on a
``save_to_disk`` chat dataset of ``--rows`` random chats (seed 0, tiny-llama, seq 64, the shipped
tiny-chat tokenizer), once through TRL's SFTTrainer (``trainer=trl``) and once through
``transformers.Trainer`` (``trainer=hf``):

* ``packing``: the default with packing on (TRL: ``packing_strategy=bfd``, rows of max_length
  prepared ahead; autotune: each micro-batch's sequences packed whole);
* ``accum2x4``: micro-batch 2 x 4 accumulation (identical math: the floor of the comparison).

Prints and writes max/mean/final |dloss| per pair and the real tokens each side trained on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.probe.worker import run_probe_in_process  # noqa: E402
from autotune.run._verify import compare_losses, reference_candidate, verify_requests  # noqa: E402
from autotune.spec.probe_request import ProbeSettings, Workload  # noqa: E402

TOKENIZER = ROOT / "autotune" / "models" / "tokenizers" / "tiny-chat"
MODEL = ROOT / "autotune" / "models" / "tiny" / "tiny-llama"


def chat_dataset(path: Path, rows: int) -> None:
    import datasets

    r = random.Random(0)
    words = "the model trains fast on small data and the answer is yes no maybe".split()
    msgs = [[{"role": "user", "content": " ".join(r.choice(words) for _ in range(r.randint(2, 12)))},
             {"role": "assistant", "content": " ".join(r.choice(words) for _ in range(r.randint(2, 20)))}]
            for _ in range(rows)]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"messages": msgs})}).save_to_disk(str(path))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "chat"
        chat_dataset(data, a.rows)
        ref = reference_candidate(8, precision="fp32")
        for trainer in ("trl", "hf"):
            wl = Workload(model="tiny-llama", model_path=str(MODEL), seq_len=64, dataset=str(data),
                          tokenizer=str(TOKENIZER), trainer=trainer)
            for name, chosen in (("packing", dataclasses.replace(ref, packing=True)),
                                 ("accum2x4", dataclasses.replace(ref, micro_batch=2, grad_accum=4))):
                rc, rr = verify_requests(chosen, ref, workload=wl, settings=ProbeSettings(device="cpu", timeout_s=900),
                                         steps=a.steps)
                c = run_probe_in_process(rc, launch_time=time.time())
                r = run_probe_in_process(rr, launch_time=time.time())
                cmp = compare_losses(c.metrics.get("losses") or [], r.metrics.get("losses") or [])
                row = {"status": [c.status, r.status], "max_abs_diff": cmp["max_abs_diff"],
                       "mean_abs_diff": cmp["mean_abs_diff"], "final_abs_diff": cmp["final_abs_diff"],
                       "real_tokens_chosen": sum(c.metrics.get("step_real_tokens") or []),
                       "real_tokens_reference": sum(r.metrics.get("step_real_tokens") or [])}
                out[f"{trainer}:{name}"] = row
                print(f"{trainer:4s} {name:9s} {json.dumps(row)}", flush=True)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"steps": a.steps, "rows": a.rows, "pairs": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
