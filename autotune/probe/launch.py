"""Distributed probes: launch W worker ranks, watch them, merge their results into one.

Run as ``python -m autotune.probe.launch REQUEST.json RESULT.json`` by
:func:`autotune.executors.local.run_probe_process` for a candidate with ``world_size > 1`` or
``zero_stage > 0``. The launcher itself never imports torch. It starts ``world_size`` processes of
``python -m autotune.probe.worker REQUEST.json RESULT.json.rank{r}.json`` with the usual
``torch.distributed`` environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT`` = a free port, chosen afresh and the ranks started
again, up to ``PORT_ATTEMPTS`` times, when rank 0's store finds it taken: a port found free by
bind-then-close can be taken by another probe's launcher, or anything, before rank 0 binds it,
which Ray's concurrent probes make likely); ``LOCAL_RANK`` picks the GPU among the
visible ones (``CUDA_VISIBLE_DEVICES`` is inherited, never narrowed per rank). The ranks are the
launcher's children in the launcher's process group, so the parent's timeout (which kills that
group) ends every rank.

Aggregation: every rank writes its own result file and the launcher merges them
(:func:`merge_rank_results`), rather than rank 0 gathering the others with a collective. A
collective after a failure hangs (the rank that ran out of memory never joins it), and a rank that
was killed writes nothing; file-per-rank keeps whatever the surviving ranks measured and the exit
code and stderr of the one that failed. When one rank fails (a failed status, or an exit without a
result) the others are given a short grace to report their own failure, then killed: they would
otherwise wait in a collective until the ``ddp_timeout`` (30 min).

Merged figures: peak memory is the max over ranks (each rank is one device); tokens/s is the real
tokens of all ranks over the slowest rank's window; step times are rank 0's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.env import tail_lines
from autotune.probe.lifetime import preexec_fn
from autotune.probe.stats import per_step_counts
from autotune.spec.probe_request import Candidate, ProbeRequest
from autotune.spec.result import ProbeResult

__all__ = [
    "is_distributed",
    "fsdp_stand_in",
    "merge_rank_results",
    "rank_result_path",
    "rank_stderr_path",
    "launch",
    "port_was_taken",
    "PORT_ATTEMPTS",
    "main",
]

# seconds the other ranks get to report their own failure after one rank failed
FAILURE_GRACE_S = 5.0
# launches with a fresh MASTER_PORT when the previous one was taken between choosing and binding
PORT_ATTEMPTS = 3
_PORT_TAKEN = ("address already in use", "eaddrinuse", "errno: 98", "errno 98")
_POLL_S = 0.1
_TAIL_LINES = 15
# the worse status wins when ranks disagree (a rank killed by the launcher reports nothing)
_STATUS_RANK = {"oom": 0, "over_budget": 1, "unsupported": 2, "crash": 3, "timeout": 4, "ok": 5}


def is_distributed(candidate: Candidate) -> bool:
    """Whether this candidate runs as several ranks / under a sharding engine (through the launcher)."""
    return candidate.world_size > 1 or candidate.zero_stage > 0


def fsdp_stand_in(candidate: Candidate) -> Candidate | None:
    """The FSDP candidate that stands in for a DeepSpeed ZeRO one when deepspeed is not installed.

    ZeRO-3 ~ FSDP ``full_shard`` (parameters, gradients and optimizer states sharded); ZeRO-2 ~
    ``shard_grad_op`` (gradients and optimizer states sharded, parameters kept whole). ZeRO-1
    (optimizer states only) has no FSDP twin; ``shard_grad_op`` is the nearest and is used.
    Offload: FSDP's CPU offload moves parameters (and with them gradients and optimizer states), so
    it stands in for ZeRO-3 ``offload=params`` only; optimizer-only offload has no FSDP equivalent
    (returns None). Stage 0 needs no stand-in (returns the candidate unchanged).
    """
    if candidate.zero_stage == 0 or candidate.sharding == "fsdp":
        return candidate
    if candidate.offload == "optimizer":
        return None
    return replace(candidate, sharding="fsdp")


def rank_result_path(result_path: str | os.PathLike[str], rank: int) -> Path:
    return Path(f"{result_path}.rank{rank}.json")


def rank_stderr_path(result_path: str | os.PathLike[str], rank: int) -> Path:
    return Path(f"{result_path}.rank{rank}.stderr")


def _tail(path: Path, lines: int = _TAIL_LINES) -> str:
    return tail_lines(path, lines)


def _how(code: int | None) -> str:
    if code is None:
        return "still running (killed by the launcher)"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _max(values: Sequence[Any]) -> Any:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _sum(values: Sequence[Any]) -> Any:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def merge_rank_results(
    request: dict[str, Any],
    results: Sequence[ProbeResult | None],
    *,
    exit_codes: Sequence[int | None],
    stderr_tails: Sequence[str] = (),
    first_failed: int | None = None,
) -> ProbeResult:
    """One result from the ranks' results.  [pure]

    ``results[r]`` is rank r's result (None: it left none), ``exit_codes[r]`` its exit code (None:
    killed by the launcher while running), ``first_failed`` the rank whose failure stopped the run.
    Status: ok only if every rank is ok and exited 0; otherwise the failing rank's status (the worst
    one when several reported, oom first), or crash with the exit code and stderr of a rank that
    died without a result (or exited non-zero after writing an ok one).
    """
    world = len(results)
    tails = list(stderr_tails) + [""] * (world - len(stderr_tails))
    base = next((res for res in results if res is not None), None)
    metrics: dict[str, Any] = dict(base.metrics) if base is not None else {}
    env: dict[str, Any] = dict(base.env) if base is not None else {}
    for key in ("cpu_util_samples", "gpu_util_samples", "rank"):
        metrics.pop(key, None)
    metrics["world_size"] = world
    metrics["ranks"] = _per_rank(results, exit_codes)
    reported = [res.metrics for res in results if res is not None]
    if reported:
        _merge_memory_and_utilisation(metrics, reported)
        if len(reported) == world and all(m.get("tokens_per_s") is not None for m in reported):
            _merge_throughput(metrics, reported)
        else:
            for key in _THROUGHPUT_KEYS:
                metrics.pop(key, None)
    status, reason = _merged_status(results, exit_codes, tails, first_failed, metrics, env)
    metrics["failed_rank"] = None if status == "ok" else first_failed
    return ProbeResult(status=status, request=request, reason=reason, metrics=metrics, env=env)


# what an incomplete distributed window cannot claim: rank 0's figures are not the run's
_THROUGHPUT_KEYS = (
    "tokens_per_s", "samples_per_s", "real_tokens", "token_slots", "padding_fraction", "step_sequences",
    "step_real_tokens", "sequences_per_step_mean", "sequences_per_step_min", "sequences_per_step_max",
    "tokens_per_step_mean",
)
# memory: each rank is one device, so the budget applies to the fullest one; times: the slowest rank's
_MAX_KEYS = (
    "peak_mem_bytes", "mem_torch_reserved_bytes", "mem_torch_allocated_bytes", "mem_nvml_process_bytes",
    "mem_rss_growth_bytes", "overhead_s", "setup_s", "warmup_s", "data_wait_fraction", "window_s", "wall_s",
)


def _per_rank(results: Sequence[ProbeResult | None], exit_codes: Sequence[int | None]) -> list[dict[str, Any]]:
    rows = []
    for r, res in enumerate(results):
        m = res.metrics if res is not None else {}
        rows.append({
            "rank": r, "status": res.status if res is not None else None, "exit_code": exit_codes[r],
            **{k: m.get(k) for k in ("tokens_per_s", "real_tokens", "window_s", "step_time_median_s",
                                     "peak_mem_bytes")},
        })  # fmt: skip
    return rows


def _merge_memory_and_utilisation(metrics: dict[str, Any], ms: list[dict[str, Any]]) -> None:
    for key in _MAX_KEYS:
        v = _max([m.get(key) for m in ms])
        if v is not None:
            metrics[key] = v
    # on one CPU host the ranks share the RAM: their sum is what the machine held
    rss = [m.get("mem_rss_growth_bytes") for m in ms]
    if any(v is not None for v in rss):
        metrics["mem_rss_growth_sum_bytes"] = _sum(rss)
    util = _sum([m.get("cpu_util_mean") for m in ms])
    if util is not None:
        metrics["cpu_util_mean"] = util
    gutil = [m.get("gpu_util_mean") for m in ms if m.get("gpu_util_mean") is not None]
    if gutil:
        metrics["gpu_util_mean"] = sum(gutil) / len(gutil)


def _merge_throughput(metrics: dict[str, Any], ms: list[dict[str, Any]]) -> None:
    """Every rank timed its window: the run's tokens are their sum over the slowest rank's window."""
    window = _max([m.get("window_s") for m in ms])
    for key in ("real_tokens", "token_slots", "data_wait_s"):
        v = _sum([m.get(key) for m in ms])
        if v is not None:
            metrics[key] = v
    metrics["tokens_per_s"] = metrics["real_tokens"] / window if window else None
    samples = _sum([(m.get("samples_per_s") or 0.0) * (m.get("window_s") or 0.0) for m in ms])
    metrics["samples_per_s"] = samples / window if window else None
    slots = metrics.get("token_slots")
    if slots:
        metrics["padding_fraction"] = max(0.0, 1.0 - metrics["real_tokens"] / slots)
    metrics["step_time_max_median_s"] = _max([m.get("step_time_median_s") for m in ms])
    # an optimizer step holds every rank's micro-batches: add the ranks' per-step counts
    seqs = [m.get("step_sequences") for m in ms]
    toks = [m.get("step_real_tokens") for m in ms]
    if all(seqs) and all(toks) and len({len(x) for x in seqs + toks}) == 1:
        metrics.update(
            per_step_counts([sum(v) for v in zip(*seqs, strict=True)], [sum(v) for v in zip(*toks, strict=True)])
        )


def _merged_status(
    results: Sequence[ProbeResult | None], exit_codes: Sequence[int | None], tails: list[str],
    first_failed: int | None, metrics: dict[str, Any], env: dict[str, Any],
) -> tuple[str, str]:
    world = len(results)
    failures = [(r, res) for r, res in enumerate(results) if res is not None and res.status != "ok"]
    if not failures and all(res is not None for res in results) and all(c in (0, None) for c in exit_codes):
        return "ok", ""
    if failures and not (
        # a rank that died first without a word is the cause; its peers' crashes (a broken
        # connection in a collective) are the consequence
        first_failed is not None
        and results[first_failed] is None
        and all(res.status == "crash" for _, res in failures)
    ):
        r, res = min(failures, key=lambda fr: (_STATUS_RANK.get(fr[1].status, 9), fr[0]))
        if res.status == "crash" and tails[r]:
            env["stderr_tail"] = tails[r]
        return res.status, f"rank {r}/{world}: {res.reason}"
    # a rank died without leaving a result (the first one that failed is the cause), or every rank
    # left an ok result and one still exited non-zero (a crash in the teardown)
    if first_failed is not None and (results[first_failed] is None or exit_codes[first_failed] not in (0, None)):
        r = first_failed
    else:
        r = next((r for r in range(world) if results[r] is None), None)
        if r is None:
            r = next(r for r in range(world) if exit_codes[r] not in (0, None))
    code = exit_codes[r]
    if results[r] is None:
        reason = f"rank {r}/{world} {_how(code)} without a result"
    else:
        reason = f"rank {r}/{world} {_how(code)} after writing an ok result"
    if code is not None and code == -signal.SIGKILL:
        reason += " (SIGKILL: possibly the kernel's out-of-memory killer)"
    if tails[r]:
        reason += f"; last stderr: {tails[r].splitlines()[-1][:300]}"
        env["stderr_tail"] = tails[r]
    metrics["exit_code"] = code
    return "crash", reason


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Stop one rank and what it started (data-loader workers): TERM, then KILL."""
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        children = []
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        for p in [proc.pid, *(c.pid for c in children)]:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    for c in children:
        try:
            c.kill()
        except psutil.Error:
            pass


def rank_env(rank: int, world_size: int, port: int, *, cpu_threads: int | None) -> dict[str, str]:
    """Environment of one rank: the torch.distributed variables, and its share of the CPU threads."""
    env = dict(os.environ)
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    if cpu_threads:
        env["OMP_NUM_THREADS"] = str(cpu_threads)
    return env


def port_was_taken(result: ProbeResult) -> bool:
    """Whether a failed launch failed because MASTER_PORT was taken (rank 0's TCPStore could not bind)."""
    if result.status == "ok":
        return False
    text = " ".join([result.reason or "", str((result.env or {}).get("stderr_tail") or "")]).lower()
    return any(k in text for k in _PORT_TAKEN)


def launch(
    request: ProbeRequest,
    result_path: str | os.PathLike[str],
    *,
    python: str | None = None,
    free_port: Any = None,
) -> ProbeResult:
    """Run the request's ranks to completion (or first failure) and return the merged result.

    A launch that failed because its MASTER_PORT was taken is repeated on a fresh port (at most
    ``PORT_ATTEMPTS`` launches; ``metrics["port_attempts"]`` says how many ran).
    """
    pick = free_port or _free_port
    for attempt in range(1, PORT_ATTEMPTS + 1):
        res = _launch_once(request, result_path, port=pick(), python=python)
        if not port_was_taken(res) or attempt == PORT_ATTEMPTS:
            break
    res.metrics["port_attempts"] = attempt
    return res


def _launch_once(
    request: ProbeRequest, result_path: str | os.PathLike[str], *, port: int, python: str | None
) -> ProbeResult:
    req_dict = request.to_dict()
    world = request.candidate.world_size
    request_path = Path(f"{result_path}.request.json")
    request_path.write_text(json.dumps(req_dict), encoding="utf-8")
    threads = request.settings.cpu_threads
    if not threads and request.settings.device == "cpu":
        threads = max(1, (os.cpu_count() or 1) // world)
    procs: list[subprocess.Popen[bytes]] = []
    for r in range(world):
        rank_result_path(result_path, r).unlink(missing_ok=True)
        with open(rank_stderr_path(result_path, r), "wb") as err:
            procs.append(
                subprocess.Popen(
                    [
                        python or sys.executable,
                        "-m",
                        "autotune.probe.worker",
                        str(request_path),
                        str(rank_result_path(result_path, r)),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    env=rank_env(r, world, port, cpu_threads=threads),
                    preexec_fn=preexec_fn(),  # a rank dies with the launcher, however it dies
                )
            )
    codes: list[int | None] = [None] * world
    results: list[ProbeResult | None] = [None] * world
    first_failed: int | None = None
    deadline: float | None = None
    killed: set[int] = set()

    def read(r: int) -> ProbeResult | None:
        path = rank_result_path(result_path, r)
        if not path.exists():
            return None
        try:
            return ProbeResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, KeyError):
            return None

    while any(c is None for c in codes):
        for r, p in enumerate(procs):
            if codes[r] is not None:
                continue
            code = p.poll()
            if code is None:
                continue
            codes[r] = code
            results[r] = read(r)
            failed = code != 0 or results[r] is None or results[r].status != "ok"  # type: ignore[union-attr]
            if failed and first_failed is None:
                first_failed = r
                deadline = time.monotonic() + FAILURE_GRACE_S
        if deadline is not None and time.monotonic() >= deadline:
            for r, p in enumerate(procs):
                if codes[r] is None:
                    _kill_tree(p)
                    killed.add(r)
                    results[r] = read(r)  # it may have written just before the kill
            break
        time.sleep(_POLL_S)
    # a rank the launcher killed has no exit code of its own
    exit_codes: list[int | None] = [None if r in killed else codes[r] for r in range(world)]
    tails = [_tail(rank_stderr_path(result_path, r)) for r in range(world)]
    return merge_rank_results(
        req_dict, results, exit_codes=exit_codes, stderr_tails=tails, first_failed=first_failed
    )


def main(argv: list[str] | None = None, *, own_process: bool = False) -> int:
    """``own_process``: run as ``__main__``, so the launcher may kill itself at its deadline."""
    from autotune.probe.lifetime import DEADLINE_GRACE_S, start_deadline
    from autotune.store.atomic import write_json_atomic

    argv = list(sys.argv[1:] if argv is None else argv)
    python = None
    if len(argv) == 4 and argv[2] == "--python":
        python, argv = argv[3], argv[:2]
    if len(argv) != 2:
        print(
            "usage: python -m autotune.probe.launch REQUEST.json RESULT.json [--python EXE]", file=sys.stderr
        )
        return 2
    request_path, result_path = argv
    req = ProbeRequest.from_dict(json.loads(Path(request_path).read_text(encoding="utf-8")))
    if own_process:
        launched = float(os.environ.get("AUTOTUNE_LAUNCH_TIME", time.time()))
        start_deadline(launched + float(req.settings.timeout_s) + DEADLINE_GRACE_S - time.time(),
                       what="distributed probe")
    res = launch(req, result_path, python=python)
    write_json_atomic(result_path, res.to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main(own_process=True))
