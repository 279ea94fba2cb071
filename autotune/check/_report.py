"""The result of ``autotune check``: items with a status and a one-line fix.  [pure]"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["STATUSES", "CheckItem", "CheckReport", "render_text"]

# info: a fact worth stating, or an item this input cannot show; never a reason to fail.
STATUSES = ("pass", "info", "warn", "fail")


@dataclass(frozen=True)
class CheckItem:
    id: str
    title: str
    status: str
    message: str
    fix: str = ""
    source: str = ""  # which file the item is about
    figures: dict[str, Any] = field(default_factory=dict)  # the numbers behind the message (check --json)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


@dataclass
class CheckReport:
    target: str
    files: list[str]
    items: list[CheckItem] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)  # e.g. the GPU, the transformers version

    @property
    def failed(self) -> bool:
        return any(i.status == "fail" for i in self.items)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for i in self.items if i.status == s) for s in STATUSES}

    def by_id(self, item_id: str) -> list[CheckItem]:
        return [i for i in self.items if i.id == item_id]

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "files": list(self.files),
            "ok": not self.failed,
            "counts": self.counts(),
            "context": dict(self.context),
            "items": [asdict(i) for i in self.items],
        }


_MARK = {"pass": "PASS", "info": "INFO", "warn": "WARN", "fail": "FAIL"}


def render_text(report: CheckReport) -> str:
    """Plain text, one line per item (and its fix), then a summary line."""
    lines = [f"autotune check {report.target} ({', '.join(report.files)})"]
    width = max((len(i.title) for i in report.items), default=0)
    for i in report.items:
        src = f" [{i.source}]" if i.source and len(report.files) > 1 else ""
        lines.append(f"  {_MARK[i.status]}  {i.title:<{width}}  {i.message}{src}")
        if i.fix and i.status in ("warn", "fail"):
            lines.append(f"        {'':<{width}}  fix: {i.fix}")
    c = report.counts()
    verdict = "FAILED" if report.failed else "OK"
    lines.append(f"{verdict}: {c['fail']} fail, {c['warn']} warn, {c['info']} info, {c['pass']} pass")
    return "\n".join(lines) + "\n"
