"""The checks of a stage's config values, each naming its option: type and finite range."""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Callable, Dict, Optional, Tuple

from pipelines.runtime.errors import Refused


def type_hints(cls: type) -> Dict[str, Any]:
    """``cls``'s annotations, resolved (cached)."""
    return _type_hints(cls)


@functools.lru_cache(maxsize=None)
def _type_hints(cls: type) -> Dict[str, Any]:
    return typing.get_type_hints(cls)


def base_type(tp: Any) -> Any:
    """``Optional[int]`` (or ``int | None``) -> ``int``; plain types unchanged."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1 else tp


#: What a value of a field annotated with each type must be, and the test. A bool is an int to
#: Python but never an option's count (``batch_size=True``), and an int is a fine float.
_KINDS: Dict[Any, Tuple[str, Callable[[Any], bool]]] = {
    bool: ("a bool (True or False)", lambda v: isinstance(v, bool)),
    int: ("an int", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number (int or float)", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    str: ("a str", lambda v: isinstance(v, str)),
}


def check_type(name: str, value: Any, tp: Any) -> None:
    """Refuse ``value`` for option ``name`` unless it fits the annotation ``tp`` (an int is not a bool).

    Raises:
        pipelines.runtime.errors.Refused: ``batch_size must be an int, got '8' (str)``."""
    kind = base_type(tp)
    optional = kind is not tp
    if kind not in _KINDS or (optional and value is None):
        return
    what, fits = _KINDS[kind]
    if not fits(value):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise Refused(f"{name} must be {what}{' or None' if optional else ''}, got {shown} ({type(value).__name__})")


def check_types(config: Any) -> None:
    """Refuse a field of the dataclass ``config`` not of its annotated type; call it first in ``__post_init__``.

    Raises:
        pipelines.runtime.errors.Refused: as ``check_type``."""
    hints = type_hints(type(config))
    for f in dataclasses.fields(config):
        if "group" not in f.metadata:
            check_type(f.name, getattr(config, f.name), hints[f.name])


def check_number(name: str, value: float, above: Optional[float] = None, at_least: Optional[float] = None,
                 below: Optional[float] = None, at_most: Optional[float] = None, why: str = "") -> None:
    """Refuse ``value`` of option ``name`` unless finite and within the given bounds.

    Raises:
        pipelines.runtime.errors.Refused: ``--base-lr must be positive and finite, got nan`` (``why`` appended)."""
    flag = name if name.startswith("-") else "--" + name.replace("_", "-")
    inside = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
              and (above is None or value > above) and (at_least is None or value >= at_least)
              and (below is None or value < below) and (at_most is None or value <= at_most))
    if not inside:
        raise Refused(f"{flag} must be {_range_text(above, at_least, below, at_most)}, got {value}"
                      + (f": {why}" if why else ""))


def _range_text(above: Optional[float], at_least: Optional[float], below: Optional[float],
                at_most: Optional[float]) -> str:
    """``check_number``'s bounds in words: ``positive and finite``, ``a finite number >= 0``, ``a number in (0, 1]``."""
    low = f"({above:g}" if above is not None else f"[{at_least:g}" if at_least is not None else None
    high = f"{below:g})" if below is not None else f"{at_most:g}]" if at_most is not None else None
    if low and high:
        return f"a number in {low}, {high}"
    if above == 0 and not high:
        return "positive and finite"  # the words of the refusals before the finite check
    bound = (f"> {above:g}" if above is not None else f">= {at_least:g}" if at_least is not None
             else f"< {below:g}" if below is not None else f"<= {at_most:g}" if at_most is not None else "")
    return f"a finite number {bound}".rstrip()
