"""Classify why a probe failed, as a pure function of the exception.  [pure: no torch import]

Out-of-memory detection follows Accelerate's ``should_reduce_batch_size``: the exception type
first (``torch.OutOfMemoryError``), then the known messages. Clearing memory is not done here: a
probe that failed simply ends its process.
"""

from __future__ import annotations

__all__ = ["classify_exception", "OOM_MARKERS", "UNSUPPORTED_MARKERS"]

OOM_MARKERS = (
    "CUDA out of memory",
    "out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
    "DefaultCPUAllocator: can't allocate memory",
    "not enough memory",
    "Cannot allocate memory",
    "HIP out of memory",
)

# message fragment -> short explanation (status "unsupported")
UNSUPPORTED_MARKERS: tuple[tuple[str, str], ...] = (
    ("flash_attn", "flash_attention_2 needs the flash-attn package and a CUDA GPU with sm80+"),
    ("FlashAttention2 has been toggled on", "flash_attention_2 needs the flash-attn package and a CUDA GPU"),
    ("Flash Attention 2", "flash_attention_2 is not available here"),
    ("does not support an attention implementation", "the model does not support this attention implementation"),
    ("does not support Flash Attention", "the model does not support flash attention"),
    ("does not support", "not supported by this model or device"),
    ("requires a GPU", "needs a GPU"),
    ("only supported on CUDA", "needs a CUDA GPU"),
    ("Your setup doesn't support bf16", "bf16 is not supported by this device"),
    ("bf16/gpu", "bf16 is not supported by this device"),
    ("is not installed", "an optional package is not installed"),
    ("No module named", "an optional package is not installed"),
)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def classify_exception(exc: BaseException) -> tuple[str, str]:
    """Return ``(status, reason)`` for an exception raised while building or training.

    ``status`` is ``oom``, ``unsupported`` or ``crash``.
    """
    names = {cls.__name__ for cls in type(exc).__mro__}
    message = str(exc)
    short = _last_line(message)[:300] or type(exc).__name__
    if "OutOfMemoryError" in names or isinstance(exc, MemoryError):
        return "oom", f"out of memory: {short}"
    if any(marker in message for marker in OOM_MARKERS):
        return "oom", f"out of memory: {short}"
    if isinstance(exc, (ImportError, ModuleNotFoundError, NotImplementedError, ValueError, RuntimeError)):
        for marker, why in UNSUPPORTED_MARKERS:
            if marker in message:
                return "unsupported", f"{why} ({type(exc).__name__}: {short})"
    return "crash", f"{type(exc).__name__}: {short}"
