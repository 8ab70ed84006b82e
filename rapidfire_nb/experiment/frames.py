"""The DataFrames the API and ``%rapidfire`` return, displayed so that they read: reasons whole, no stray index.

pandas cuts every text cell at ``display.max_colwidth`` (50 characters), so a stop reason read "...not in th...".
:class:`RunsFrame` (``get_runs_info()``, ``%rapidfire status``) shows ``stop_reason`` whole and ``error`` cut at a
word, and cuts the other long values (``config``) as pandas did; :class:`ListFrame` (``%rapidfire list``) hides
pandas' 0-based index. Only the display changes: they are DataFrames (subclasses) holding every value whole, and
what pandas derives from them (a slice, ``drop``, ``set_index``) keeps their display. Imports pandas: import this
module only where a table is made.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pandas as pd

from ..view.text import cut_at_word

__all__ = ["ListFrame", "RunsFrame"]

#: What pandas shows of any other long text cell (its ``display.max_colwidth`` default).
_OTHER_WIDTH = 50


class _ReadableFrame(pd.DataFrame):
    """A DataFrame whose display shows the columns of :attr:`_WIDTHS` up to their width, cut at a word."""

    _WIDTHS: ClassVar[dict[str, int]] = {}
    _SHOW_INDEX: ClassVar[bool] = True

    def _display_frame(self) -> pd.DataFrame:
        """A plain copy of the frame with each long text cut for display (the frame itself keeps it whole)."""
        plain = pd.DataFrame(self).copy()
        for col in plain.columns:
            if plain[col].dtype != object:
                continue
            width = self._WIDTHS.get(str(col), _OTHER_WIDTH)
            # built as objects: Series.map would infer pandas' str dtype for texts beside None, printing NaN
            plain[col] = pd.Series([_cut(v, width) for v in plain[col]], index=plain.index, dtype=object)
        return plain

    def __repr__(self) -> str:
        with pd.option_context("display.max_colwidth", None):
            plain = self._display_frame()
            return plain.to_string(index=False) if not self._SHOW_INDEX else repr(plain)

    def _repr_html_(self) -> str | None:
        with pd.option_context("display.max_colwidth", None):
            plain = self._display_frame()
            if self._SHOW_INDEX:
                return plain._repr_html_()
            return plain.to_html(index=False, notebook=True, max_rows=pd.get_option("display.max_rows"))


def _cut(value: Any, width: int) -> Any:
    """A text (or a dict / list, as pandas prints it) longer than ``width``, cut at a word; anything else as is."""
    if isinstance(value, str):
        return cut_at_word(value, width)
    if isinstance(value, (dict, list, tuple)):
        text = str(value)
        return cut_at_word(text, width) if len(text) > width else value
    return value


class RunsFrame(_ReadableFrame):
    """``get_runs_info()``'s table: ``stop_reason`` shown whole (at most 200 characters: a stop's own reason's limit;
    the policy's run ~90), ``error`` up to 160 characters cut at a word, other texts at 50 as pandas does."""

    _WIDTHS: ClassVar[dict[str, int]] = {"stop_reason": 200, "error": 160, "run_name": 128}  # a name whole

    @property
    def _constructor(self) -> type[RunsFrame]:
        return RunsFrame


class ListFrame(_ReadableFrame):
    """``%rapidfire list``'s table: one row per experiment, shown without pandas' 0-based index."""

    _SHOW_INDEX: ClassVar[bool] = False

    @property
    def _constructor(self) -> type[ListFrame]:
        return ListFrame
