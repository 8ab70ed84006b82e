"""Row formats: the columns and value shapes each TRL trainer reads from a row, checked before training.

TRL picks a row's format from the columns it finds (SFT: ``input_ids``, then ``conversations``, then
``prompt``/``completion``, then ``messages``, then ``dataset_text_field``) and then trusts the values: a
``prompt`` list of strings fails deep inside TRL (``'list' object has no attribute 'endswith'``) and a
``messages`` string tokenises to nothing ("the training set is empty"). :func:`row_problem` finds the format
the trainer will pick for one row and says what is wrong with it, naming the column and the expected shape.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CHAT", "FROM_VALUE", "IDS", "TEXT", "TEXT_OR_CHAT", "RowFormat", "describe_value", "row_problem"]

TEXT = "text"
CHAT = "chat"
TEXT_OR_CHAT = "text or chat"
IDS = "token ids"
FROM_VALUE = "from/value"

_MESSAGES = "lists of {'role': ..., 'content': ...} messages"


@dataclass(frozen=True)
class RowFormat:
    """One row format a trainer accepts.

    Attributes:
        columns: the columns it needs; the trainer picks it when the first one is in the row.
        shape: ``TEXT`` (strings), ``CHAT`` (non-empty lists of role/content messages), ``TEXT_OR_CHAT`` (all
            strings or all message lists), ``IDS`` (lists of token ids) or ``FROM_VALUE`` (ShareGPT turns).
        note: where the column name comes from, for messages (e.g. ``"dataset_text_field"``).
    """

    columns: tuple[str, ...]
    shape: str
    note: str = ""

    def expected(self) -> str:
        """E.g. ``"prompt/completion both strings, or both lists of {'role': ..., 'content': ...} messages"``."""
        names = "/".join(self.columns)
        n = len(self.columns)
        each = "" if n == 1 else ("both " if n == 2 else "all ")
        text = {
            TEXT: f"{names} {each}{'strings' if each else 'a string'}",
            CHAT: f"{names} {each}{'non-empty ' + _MESSAGES if each else 'a non-empty list of role/content messages'}",
            TEXT_OR_CHAT: f"{names} {each}{'strings' if each else 'a string'}, or {each}{_MESSAGES if each else 'a non-empty list of role/content messages'}",
            IDS: f"{names} a list of token ids (already tokenized)",
            FROM_VALUE: f"{names} a list of {{'from': ..., 'value': ...}} turns",
        }[self.shape]
        return text + (f" ({self.note})" if self.note else "")


def _is_chat(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in value)
    )


def _fits(value: Any, shape: str) -> bool:
    if shape == TEXT:
        return isinstance(value, str)
    if shape == CHAT:
        return _is_chat(value)
    if shape == IDS:
        return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    if shape == FROM_VALUE:
        return (
            isinstance(value, list)
            and bool(value)
            and all(isinstance(m, Mapping) and "value" in m for m in value)
        )
    return isinstance(value, str) or _is_chat(value)  # TEXT_OR_CHAT, per column


def describe_value(value: Any) -> str:
    """A short description of a value for messages: ``"['text'] (a list of str)"``."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    if isinstance(value, list):
        kinds = sorted({type(v).__name__ for v in value})
        what = f"a list of {' and '.join(kinds)}" if kinds else "an empty list"
        if value and all(isinstance(v, Mapping) for v in value) and not _is_chat(value):
            what += " without 'role'/'content' keys"
    else:
        what = f"a {type(value).__name__}" if value is not None else "None"
    return f"{text} ({what})"


def row_problem(row: Mapping[str, Any], formats: Sequence[RowFormat]) -> str | None:
    """What is wrong with one row for the format the trainer will pick (the first whose first column it has).

    Args:
        row: the row as the trainer receives it (after ``formatting_func``).
        formats: the trainer kind's formats, in the order the trainer tries them.

    Returns:
        ``None`` when the row fits, ``"no format"`` when no format's first column is in the row, else e.g.
        ``"prompt = ['text'] (a list of str); SFT expects prompt and completion both strings, or ..."`` minus the
        kind's name: ``"prompt = ['text'] (a list of str), expected prompt and completion both ..."``.
    """
    for fmt in formats:
        if fmt.columns[0] not in row:
            continue
        missing = [c for c in fmt.columns if c not in row]
        if missing:
            return (
                f"it has {fmt.columns[0]} but no {'/'.join(missing)} (its columns: {', '.join(sorted(row))}); "
                f"expected {fmt.expected()}"
            )
        for col in fmt.columns:
            if not _fits(row[col], fmt.shape):
                return f"{col} = {describe_value(row[col])}; expected {fmt.expected()}"
        if fmt.shape == TEXT_OR_CHAT and len({isinstance(row[c], str) for c in fmt.columns}) > 1:
            kinds = ", ".join(
                f"{c} {'a string' if isinstance(row[c], str) else 'messages'}" for c in fmt.columns
            )
            return f"{kinds}: mixed; expected {fmt.expected()}"
        return None
    return "no format"
