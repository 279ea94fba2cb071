"""The search strategies ``autotune run --strategy`` offers (``AutotuneSampler(strategy=...)``).  [pure]"""

from __future__ import annotations

__all__ = ["STRATEGIES"]

# walk: seeds, step-downs, the neighbourhood walk, TPE (the default); model: a model fitted to the run's
# probes ranks every configuration and stops the search when none can beat the best; the others are what a user
# might otherwise do, as samplers over the same study (see autotune/search/_sampler.py)
STRATEGIES = ("walk", "model", "tpe", "random", "grid", "largest-fits", "deepspeed")
