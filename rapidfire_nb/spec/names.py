"""Run names and tags: the labels a run is shown with next to its id (panel, page, ``get_runs_info()``, TensorBoard,
MLflow, Trackio, W&B), never a key: the run id stays the one identity, and neither label is part of
``LeafConfig.fingerprint()``.

A name may be a template: ``"lr{learning_rate}-r{lora.r}"`` is filled per run from its hyperparameters (the
``hparams()`` naming scheme, TRL's default where the run does not set a trainer or LoRA field), with Python's format
specs (``"{learning_rate:.0e}"`` -> ``"1e-04"``) and ``{{``/``}}`` for literal braces. Runs of one expansion that
would share a name get the hyperparameters they differ in appended (:func:`unique_names`). Standard library only.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rapidfire_nb.errors import ConfigError, closest_name

__all__ = [
    "MAX_NAME_LENGTH",
    "MAX_TAGS",
    "MAX_TAG_LENGTH",
    "check_run_name",
    "check_tags",
    "clone_name",
    "fill_run_name",
    "template_fields",
    "unique_names",
]

MAX_NAME_LENGTH = 128
"""Longest run name, in characters (W&B's display-name limit; MLflow takes 250)."""
MAX_TAG_LENGTH = 64
"""Longest tag, in characters (W&B's tag limit)."""
MAX_TAGS = 32
"""Most tags per run."""

_CLONE = " (clone)"


def _bad_char(text: str) -> str | None:
    """The first control character of ``text`` (a newline, a tab...), as ``repr`` shows it; None when there is none."""
    return next((repr(c) for c in text if ord(c) < 32 or ord(c) == 127), None)


def check_run_name(value: Any, where: str = "run_name") -> str | None:
    """Check a run name (or name template) as the user wrote it.

    Args:
        value: ``None`` (no name: the run is shown by its id alone) or a text of 1 to :data:`MAX_NAME_LENGTH`
            characters, without control characters.
        where: what the message names, e.g. ``"RFModelConfig.run_name"``.

    Returns:
        The name with surrounding spaces removed, or None.

    Raises:
        ConfigError: not a str, empty, too long, or with a newline/tab/control character.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(
            f'{where} must be a str (a label shown next to the run id, e.g. "baseline" or a template such as '
            f'"lr{{learning_rate}}-r{{lora.r}}"), got {type(value).__name__} {value!r}'
        )
    name = value.strip()
    if not name:
        raise ConfigError(f"{where} is empty; give a label such as 'baseline', or leave it out (None)")
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigError(f"{where} has {len(name)} characters; keep it to {MAX_NAME_LENGTH} (W&B's limit)")
    bad = _bad_char(name)
    if bad:
        raise ConfigError(f"{where} holds the control character {bad}; a run name is one line of text")
    return name


def check_tags(value: Any, where: str = "tags") -> tuple[str, ...]:
    """Check a run's free tags.

    Args:
        value: ``None`` (no tags), one tag as a str, or a list/tuple of str, each 1 to :data:`MAX_TAG_LENGTH`
            characters without control characters; at most :data:`MAX_TAGS`.
        where: what the message names, e.g. ``"RFModelConfig.tags"``.

    Returns:
        The tags, stripped, repeats dropped, in the order given.

    Raises:
        ConfigError: not a str or a list of str, an empty or too long tag, a control character, too many tags.
    """
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ConfigError(
            f'{where} must be a list of str (e.g. ["baseline", "lora"]), got {type(value).__name__} {value!r}'
        )
    out: list[str] = []
    for i, tag in enumerate(items):
        if not isinstance(tag, str):
            raise ConfigError(f"{where}[{i}] must be a str, got {type(tag).__name__} {tag!r}")
        text = tag.strip()
        if not text or len(text) > MAX_TAG_LENGTH:
            raise ConfigError(f"{where}[{i}] {tag!r}: a tag has 1 to {MAX_TAG_LENGTH} characters")
        bad = _bad_char(text)
        if bad:
            raise ConfigError(f"{where}[{i}] holds the control character {bad}")
        if text not in out:
            out.append(text)
    if len(out) > MAX_TAGS:
        raise ConfigError(f"{where} has {len(out)} tags; keep it to {MAX_TAGS}")
    return tuple(out)


def template_fields(name: str, where: str = "run_name") -> list[str]:
    """The fields a name template fills (``"lr{learning_rate}-r{lora.r}"`` -> ``["learning_rate", "lora.r"]``).

    Raises:
        ConfigError: unbalanced braces, or an empty ``{}`` (a field names a hyperparameter).
    """
    try:
        parts = list(string.Formatter().parse(name))
    except ValueError as exc:
        raise ConfigError(
            f"{where} {name!r} is not a valid template ({exc}); write {{{{ and }}}} for literal braces"
        ) from None
    fields = []
    for _, field, _, _ in parts:
        if field is None:
            continue
        if not field or field.isdigit():
            raise ConfigError(
                f"{where} {name!r}: an empty or numbered field {{{field}}}; name a hyperparameter, e.g. "
                "{learning_rate} or {lora.r}"
            )
        fields.append(field)
    return fields


def _text(value: Any, spec: str = "") -> str:
    """A hyperparameter value as a name shows it: lists joined with commas, floats in ``g`` form (``0.0001``)."""
    if spec:
        return format(value, spec)
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    if isinstance(value, float):
        return format(value, "g")
    return str(value)


def fill_run_name(
    name: str | None,
    values: Mapping[str, Any],
    default: Callable[[str], Any] | None = None,
    where: str = "run_name",
) -> str | None:
    """Fill a name template with one run's values; a name without fields comes back as it is.

    Args:
        name: the (checked) name or template, or None.
        values: the run's hyperparameters (``LeafConfig.hparams()``, plus ``trainer_type``).
        default: ``field -> value`` for a field the run does not set (TRL's or PEFT's default); raises
            ``KeyError`` when there is none.
        where: what the message names.

    Returns:
        The filled name (checked: :func:`check_run_name`), or None.

    Raises:
        ConfigError: a field that is not a hyperparameter of the run (the message lists them and names the closest),
            or a format spec that does not fit its value.
    """
    if name is None or not template_fields(name, where):
        return name
    out = []
    for literal, field, spec, conversion in string.Formatter().parse(name):
        out.append(literal)
        if field is None:
            continue
        value = _lookup(field, values, default, where, name)
        if conversion:
            value = repr(value) if conversion == "r" else ascii(value) if conversion == "a" else str(value)
        try:
            out.append(_text(value, spec or ""))
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"{where} {name!r}: {{{field}:{spec}}} does not fit the value {value!r} ({exc})"
            ) from None
    return check_run_name("".join(out), f"{where} (filled: {''.join(out)!r})")


def _lookup(
    field: str, values: Mapping[str, Any], default: Callable[[str], Any] | None, where: str, name: str
) -> Any:
    if field in values:
        return values[field]
    if default is not None:
        try:
            return default(field)
        except KeyError:
            pass
    hint = closest_name(field, list(values))
    raise ConfigError(
        f"{where} {name!r}: {{{field}}} is not a hyperparameter of this run"
        + (f"; did you mean {{{hint}}}?" if hint else "")
        + f" (its values: {', '.join(sorted(values))}; or any field of its trainer config / LoRA config)"
    )


def clone_name(parent: str | None) -> str | None:
    """A clone's name when its changes give none: ``"<parent name> (clone)"`` (the parent's name cut with an ellipsis
    to fit :data:`MAX_NAME_LENGTH`); None for a parent without a name."""
    if parent is None:
        return None
    room = MAX_NAME_LENGTH - len(_CLONE)
    base = parent if len(parent) <= room else parent[: room - 1].rstrip() + "…"
    return base + _CLONE


def _short(keys: Sequence[str]) -> dict[str, str]:
    """Each key's last dotted part (``lora.r`` -> ``r``) where that is unambiguous, else the key itself."""
    tails = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (t if tails.count(t) == 1 else k) for k, t in zip(keys, tails, strict=True)}


def unique_names(names: Sequence[str | None], hparams: Sequence[Mapping[str, Any]]) -> list[str | None]:
    """Names made unique within one expansion: runs sharing a name get ``" (<key>=<value>, ...)"`` appended, the
    hyperparameters in which they differ (short keys: ``lora.r`` as ``r``); runs that differ in none, or whose name
    would grow past :data:`MAX_NAME_LENGTH`, get ``" #1"``, ``" #2"``... instead. Unnamed runs stay unnamed.

    Args:
        names: each run's (filled) name or None, in run order.
        hparams: each run's hyperparameters (``LeafConfig.hparams()``), in the same order.

    Returns:
        The names, in the same order.
    """
    out = list(names)
    groups: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        if name is not None:
            groups.setdefault(name, []).append(i)
    for name, members in groups.items():
        if len(members) < 2:
            continue
        keys = _differing([hparams[i] for i in members])
        short = _short(keys)
        labels = [
            name + " (" + ", ".join(f"{short[k]}={_text(hparams[i].get(k))}" for k in keys) + ")"
            for i in members
        ]
        if not keys or len(set(labels)) < len(labels) or max(map(len, labels)) > MAX_NAME_LENGTH:
            labels = [f"{name[: MAX_NAME_LENGTH - 6]} #{n}" for n in range(1, len(members) + 1)]
        for i, label in zip(members, labels, strict=True):
            out[i] = label
    return out


def _differing(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The keys whose values are not the same in every row (a key missing from a row counts as a value), in first-seen
    order."""
    rows = list(rows)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    missing = object()
    return [k for k in keys if len({repr(row.get(k, missing)) for row in rows}) > 1]
