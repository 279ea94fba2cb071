"""Secrets out of messages: the password of a URL, access tokens.  [pure]

``--storage postgresql://user:s3cret@host/db`` that fails must not print ``s3cret`` back (terminals,
CI logs and bug reports keep it). Every error line the CLI prints goes through :func:`redact`.
"""

from __future__ import annotations

import re

__all__ = ["redact"]

# scheme://user:password@host  ->  scheme://user:***@host   (also a password with no user)
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\"]*:)(?P<secret>[^\s@/'\"]+)(?=@)")
# Hugging Face, GitHub and OpenAI-style tokens; ``token=...`` / ``password=...`` query parameters
_TOKENS = re.compile(r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9\-_]{20,})\b")
_PARAMS = re.compile(r"(?i)(?P<head>[?&;](?:password|passwd|pwd|token|secret|api_key)=)(?P<secret>[^&\s'\"]+)")


def redact(text: str) -> str:
    """``text`` with URL passwords, known token shapes and secret query parameters replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + "***", text)
    text = _PARAMS.sub(lambda m: m.group("head") + "***", text)
    return _TOKENS.sub("***", text)
