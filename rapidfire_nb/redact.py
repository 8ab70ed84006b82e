"""Secrets in configs: which keys hold one, and the redacted copy of a config that is stored or shown.

A run's config may carry credentials: ``hub_token`` (a trainer field), ``token`` / ``use_auth_token`` in
``model_kwargs`` or ``tokenizer_kwargs``, an API key in a callback's settings. The real value stays in memory only
(the run trains with it); everything that stores or shows a config — the store's config/hparams/fingerprint
columns, meta, the ops log, TensorBoard, the server's replies, the panel, ``get_runs_info``, printed lines, the
``training_args.bin`` of a checkpoint — holds :data:`REDACTED` in its place.

A key is secret-like (:func:`is_secret_key`, case-insensitive, anywhere in a dotted name) when it contains
``api_key``/``apikey``, ``password``/``passwd``, ``secret``, ``credential``, ``private_key``, ``access_key``,
``authorization`` or ``token`` — except where "token" means a piece of text, not a credential: ``tokenizer``,
counts and lists of tokens (``max_new_tokens``, ``suppress_tokens``), special tokens (``pad_token``, ``eos_token``
...) and token ids/indices (``pad_token_id``, ``trainable_token_indices``, ``token_healing``). Those stay visible.

Standard library only; every layer may import it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["REDACTED", "first_secret_key", "hide_url_passwords", "is_secret_key", "omit_secrets", "redact"]

REDACTED = "<redacted>"
"""What a secret's value is replaced by (it starts with ``<``: the page and the server never offer it as editable)."""

_SECRET = re.compile(
    r"api_?key|passw(?:or)?d|secret|credential|private_?key|access_?key|authori[sz]ation", re.IGNORECASE
)
_TEXT_TOKEN = re.compile(
    r"tokeni[sz]er|tokens|(?:pad|eos|bos|unk|sep|cls|mask|start|end|special)_?token"
    r"|token_?(?:ids?|indices|healing|type)",
    re.IGNORECASE,
)


def is_secret_key(key: object) -> bool:
    """True when a config key names a credential (see the module docstring for the rule and its exceptions).

    Args:
        key: a field or dict key, or a dotted hyperparameter name (``model_kwargs.token``).
    """
    text = str(key)
    if _SECRET.search(text):
        return True
    return "token" in _TEXT_TOKEN.sub(" ", text).lower()


def _hidden(value: Any) -> bool:
    """Values worth hiding: not None, not a bool (``use_auth_token=True`` only says "use the cached one"), not ""."""
    return value is not None and not isinstance(value, bool) and value != ""


def redact(value: Any) -> Any:
    """A copy of ``value`` with the value under every secret-like key replaced by :data:`REDACTED`.

    Mappings (as dicts), lists and tuples are walked; other values are returned as they are.
    """
    if isinstance(value, Mapping):
        return {k: (REDACTED if is_secret_key(k) and _hidden(v) else redact(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value


def omit_secrets(value: Any) -> Any:
    """A copy of ``value`` without the secret-like keys at all (what a config's fingerprint is made of)."""
    if isinstance(value, Mapping):
        return {k: omit_secrets(v) for k, v in value.items() if not is_secret_key(k)}
    if isinstance(value, (list, tuple)):
        return type(value)(omit_secrets(v) for v in value)
    return value


def first_secret_key(value: Any, path: str) -> str | None:
    """The dotted path of the first secret-like key in ``value`` (named ``path``), the path itself if it is one."""
    if is_secret_key(path.rpartition(".")[2]):
        return path
    if isinstance(value, Mapping):
        for k, v in value.items():
            found = first_secret_key(v, f"{path}.{k}")
            if found:
                return found
    return None


_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^@\s/]+@")


def hide_url_passwords(text: str) -> str:
    """``text`` with the password of every URL in it redacted (``http://alice:S3cret@host`` ->
    ``http://alice:<redacted>@host``): an error message quoting a tracking URI (MLflow's HTTP client does) is
    printed and stored."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:{REDACTED}@", text)
