"""Compile DeepSpeed's CPU ops once, at set-up, instead of inside the first ZeRO test that needs them.

DeepSpeed builds an op on its first use (a JIT C++ build into ``TORCH_EXTENSIONS_DIR``, default
``~/.cache/torch_extensions``) and rebuilds it whenever its sources look newer, which a fresh venv's
install makes them: about 1-3 minutes per op on 2 cores. Two venvs sharing the default folder (a second
clone, a fresh-clone check) rebuilt each other's ops in turn, inside the first ZeRO test each time; so the
suite and this script build into the venv's own folder (``<venv>/torch_extensions``, ``use_venv_ops_dir``)
unless ``TORCH_EXTENSIONS_DIR`` is set. The CPU tier's two-rank ZeRO probes use two:
``deepspeed_shm_comm`` (the ranks' collectives on one host) and ``cpu_adam`` (ZeRO's optimizer offload).
``make setup`` runs this after installing, so the build is set-up, not test time; an op that cannot be
built here is left for the test to build (and to fail on, with DeepSpeed's own message).

    python tests/_build_ops.py
"""

from __future__ import annotations

import os
import sys
import time

OPS = ("ShareMemCommBuilder", "CPUAdamBuilder")


def use_venv_ops_dir() -> str:
    """``TORCH_EXTENSIONS_DIR`` for this process and what it starts: the venv's own folder unless already set."""
    return os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))


def main() -> int:
    use_venv_ops_dir()
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError:
        print("build-ops: deepspeed is not installed; nothing to build")
        return 0
    accel = get_accelerator()
    if accel.device_name() != "cpu":
        print(f"build-ops: DeepSpeed's accelerator is {accel.device_name()}; the CPU ops are not built ahead")
        return 0
    for name in OPS:
        start = time.monotonic()
        try:
            accel.get_op_builder(name)().load(verbose=False)
        except Exception as exc:  # left to the test that needs it; say why here
            print(f"build-ops: {name} was not built ({type(exc).__name__}: {exc}); the first ZeRO test builds it")
            continue
        print(f"build-ops: {name} ready ({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
