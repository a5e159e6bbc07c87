"""The progress line of long work, pure arithmetic and formatting (no Spark); the rate is the mean since the start."""
from __future__ import annotations

import math
from typing import Optional

from pipelines.runtime.logs import plural


def format_duration(seconds: float) -> str:
    """A duration rounded to whole seconds: ``"45 s"``, ``"2 min 5 s"``, ``"1 h 2 min"`` (no seconds from an hour on).

    Raises:
        ValueError: ``seconds`` negative or not finite."""
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"a duration is a finite number of seconds >= 0, got {seconds}")
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def rate_and_left(done: int, total: int, elapsed_s: float) -> "tuple[Optional[float], Optional[float]]":
    """``(items per second, seconds left)``; ``(None, None)`` while nothing is done or no time has passed."""
    if done <= 0 or elapsed_s <= 0:
        return None, None
    rate = done / elapsed_s
    return rate, max(0, total - done) / rate


def rate_text(rate: float) -> str:
    """A rate with one decimal, or two significant digits below 1, so a slow job never reads ``0.0``."""
    return f"{rate:.1f}" if rate >= 1 else f"{rate:.2g}"


def progress_line(what: str, done: int, total: int, elapsed_s: float, unit: str = "image",
                  finished: bool = False, units: str = "") -> str:
    """One progress line of ``what`` (a stage's name), ``done`` of ``total`` items after ``elapsed_s`` seconds.

    Args:
        finished: the last line (``done`` may be below ``total``): ``done in <duration>`` instead of the time left.

    Returns:
        ``"<what>: <done>/<total> <units> (<percent> %), <rate> <units>/s, <left> left"``, the percentage floored."""
    nouns = plural(2, unit, units).split(" ", 1)[1]
    head = f"{what}: {done:,}/{total:,} {unit if total == 1 else nouns}"
    if total > 0:
        head += f" ({100 * done // total} %)"
    rate, left = rate_and_left(done, total, elapsed_s)
    speed = f", {rate_text(rate)} {nouns}/s" if rate is not None else ""
    if finished:
        return f"{head}{speed}, done in {format_duration(elapsed_s)}"
    if rate is None:
        return f"{head}, rate not known yet ({format_duration(elapsed_s)} elapsed)"
    return f"{head}{speed}, {format_duration(left)} left"
