"""Search-space knobs: ``List`` (categorical) and ``Range`` (numeric interval).

A knob may stand in for any value of a config: a whole ``RFModelConfig`` field, a field of an
``RFLoraConfig``/``RFSFTConfig``/..., or a value inside ``model_kwargs``. ``RFGridSearch`` enumerates
every ``List``; ``RFRandomSearch`` draws from ``List`` and ``Range``. Standard library only, besides the
spec's ``Knob`` marker both subclass (so a ``LeafConfig`` recognises a knob left in it).
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Iterable, Iterator
from typing import Any

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec.values import Knob

__all__ = ["List", "Range", "is_knob"]


class List(Knob):
    """A categorical knob: one of several alternative values.

    ``List([a, b])`` expands to two runs in a grid search and is drawn uniformly in a random search.
    Values may themselves hold knobs (e.g. ``List([RFLoraConfig(r=List([8, 16])), None])``).

    Args:
        values: The alternatives, in the order the grid search visits them (a list, tuple or any
            non-string iterable). At least one value.

    Raises:
        ConfigError: ``values`` is a string, a dict, not iterable, or empty.
    """

    __slots__ = ("values",)

    def __init__(self, values: Iterable[Any]) -> None:
        if isinstance(values, (str, bytes, dict)) or not isinstance(values, Iterable):
            raise ConfigError(
                f"List expects a list of alternative values, got {type(values).__name__} {values!r}; "
                "write List([value1, value2])"
            )
        self.values: list[Any] = list(values)
        if not self.values:
            raise ConfigError("List needs at least one value, got an empty list")

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: int) -> Any:
        return self.values[index]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, List) and other.values == self.values

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"List({self.values!r})"

    def sample(self, rng: random.Random | None = None) -> Any:
        """Draw one alternative uniformly.

        Args:
            rng: The generator to draw from (``random.Random(seed)`` for reproducible draws); a fresh
                unseeded one when ``None``.

        Returns:
            One element of ``values`` (knobs inside it are not resolved here).
        """
        return (rng or random.Random()).choice(self.values)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class Range(Knob):
    """A numeric interval knob ``[start, end]`` (both ends inclusive) for random search.

    Args:
        start: Lower bound.
        end: Upper bound; must be greater than ``start``.
        dtype: ``"int"``/``int`` or ``"float"``/``float``. Inferred when ``None``: ``"int"`` if both
            bounds are ints, otherwise ``"float"``. Int ranges need integral bounds.
        log: Sample log-uniformly (both bounds must be > 0), e.g. learning rates.
        step: Quantise: sampled values are ``start + k * step`` for integer ``k >= 0`` and never above
            ``end``. Must be > 0 (an integer for int ranges). Not combinable with ``log``.

    Raises:
        ConfigError: Non-numeric bounds, ``start >= end``, unknown ``dtype``, non-integral bounds for
            an int range, ``log`` with a bound <= 0, ``step <= 0``, or ``log`` together with ``step``.

    Example:
        ``Range(1e-5, 1e-3, log=True)`` draws learning rates evenly over orders of magnitude;
        ``Range(8, 64, step=8)`` draws one of 8, 16, ..., 64.
    """

    __slots__ = ("dtype", "end", "log", "start", "step")

    def __init__(
        self,
        start: float,
        end: float,
        dtype: str | type | None = None,
        log: bool = False,
        step: float | None = None,
    ) -> None:
        if not (_is_number(start) and _is_number(end)):
            raise ConfigError(f"Range bounds must be numbers, got start={start!r}, end={end!r}")
        if start >= end:
            raise ConfigError(f"Range start must be < end, got start={start!r}, end={end!r}")
        if dtype is None:
            dtype = (
                "int"
                if isinstance(start, numbers.Integral) and isinstance(end, numbers.Integral)
                else "float"
            )
        elif dtype is int or dtype is float:
            dtype = dtype.__name__
        if dtype not in ("int", "float"):
            raise ConfigError(f"Range dtype must be 'int' or 'float', got {dtype!r}")
        if dtype == "int":
            if float(start) != int(start) or float(end) != int(end):
                raise ConfigError(
                    f"Range(dtype='int') needs whole-number bounds, got start={start!r}, end={end!r}; "
                    "use dtype='float'"
                )
            start, end = int(start), int(end)
        else:
            start, end = float(start), float(end)
        if log and step is not None:
            raise ConfigError("Range: log=True and step cannot be combined; choose one")
        if log and (start <= 0 or end <= 0):
            raise ConfigError(f"Range(log=True) needs bounds > 0, got start={start!r}, end={end!r}")
        if step is not None:
            if not _is_number(step) or step <= 0:
                raise ConfigError(f"Range step must be > 0, got step={step!r}")
            if dtype == "int":
                if float(step) != int(step):
                    raise ConfigError(f"Range(dtype='int') needs a whole-number step, got step={step!r}")
                step = int(step)
        self.start: int | float = start
        self.end: int | float = end
        self.dtype: str = dtype
        self.log: bool = bool(log)
        self.step: int | float | None = step

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Range) and all(
            getattr(self, name) == getattr(other, name) for name in self.__slots__
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        extra = ""
        if self.log:
            extra += ", log=True"
        if self.step is not None:
            extra += f", step={self.step!r}"
        return f"Range({self.start!r}, {self.end!r}, dtype={self.dtype!r}{extra})"

    def sample(self, rng: random.Random | None = None) -> int | float:
        """Draw one value.

        Args:
            rng: The generator to draw from (``random.Random(seed)`` for reproducible draws); a fresh
                unseeded one when ``None``.

        Returns:
            An ``int`` for int ranges, a ``float`` otherwise, always within ``[start, end]``.
        """
        rng = rng or random.Random()
        low, high = self.start, self.end
        if self.log:
            value = math.exp(rng.uniform(math.log(low), math.log(high)))
            if self.dtype == "int":
                return min(max(round(value), int(low)), int(high))
            return min(max(value, float(low)), float(high))
        if self.step is not None:
            n_steps = math.floor((high - low) / self.step + 1e-9)
            value = low + rng.randint(0, n_steps) * self.step
            if self.dtype == "int":
                return int(value)
            return min(float(f"{value:.12g}"), float(high))
        if self.dtype == "int":
            return rng.randint(int(low), int(high))
        return rng.uniform(float(low), float(high))


def is_knob(value: Any) -> bool:
    """Return True when ``value`` is a ``List`` or a ``Range``."""
    return isinstance(value, (List, Range))
