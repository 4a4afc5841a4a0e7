"""Progress reporting: a tqdm bar with rate and ETA on a terminal, periodic plain log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any


class Progress:
    """Counts work done; draws a bar on an interactive terminal, else logs a line every ``interval`` seconds."""

    def __init__(self, total: int, initial: int = 0, desc: str = "", *, logger: logging.Logger | None = None,
                 quiet: bool = False, interval: float = 10.0, stream=None) -> None:
        self.total, self.n, self.desc = total, initial, desc
        self._logger = logger or logging.getLogger("fedarena")
        self._interval = interval
        self._start_n, self._start_t = initial, time.monotonic()
        self._last_log = self._start_t
        self._postfix: dict[str, Any] = {}
        stream = stream or sys.stderr
        self._bar = None
        if not quiet and getattr(stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, file=stream, dynamic_ncols=True)

    def update(self, n: int = 1, **postfix: Any) -> None:
        self.n += n
        if postfix:
            self._postfix = postfix
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix({k: _fmt(v) for k, v in postfix.items()}, refresh=False)
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last_log >= self._interval or self.n >= self.total:
            self._last_log = now
            self._logger.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        rate = (self.n - self._start_n) / max(now - self._start_t, 1e-9)
        eta = (self.total - self.n) / rate if rate > 0 else float("inf")
        extra = " ".join(f"{k}={_fmt(v)}" for k, v in self._postfix.items())
        pct = 100.0 * self.n / max(self.total, 1)
        return f"{self.desc} {self.n}/{self.total} ({pct:.0f}%) {rate:.1f} it/s eta {_eta(eta)} {extra}".strip()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _eta(seconds: float) -> str:
    if seconds == float("inf"):
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"
