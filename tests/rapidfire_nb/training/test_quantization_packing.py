"""Packs on a quantized shared base (issues 35 and 38): 3 LoRA runs (ranks 4, 8, 2, their own learning rates) on
one 4-bit NF4 base, then one 8-bit base, train as one pack (every step a fused pass through PEFT's bitsandbytes
LoRA layers) and each ends equal to a plain TRL run on the same quantized base (0.0)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "bitsandbytes", reason="bitsandbytes is not installed (pip install 'rapidfire_nb[quantization]')"
)

sys.path.insert(0, str(Path(__file__).parent))
from _quantized import group, quantized_create_model, save_tiny  # noqa: E402

from rapidfire_nb import Experiment  # noqa: E402
from rapidfire_nb.testing import tiny_sft_dataset  # noqa: E402
from tests.helpers import adapter_state, max_abs_diff, train_plain_trl  # noqa: E402

SEED = 7


@pytest.mark.parametrize("bits", [4, 8])
def test_a_pack_on_a_quantized_base_equals_plain_trl(bits: int, tmp_path: Path) -> None:
    name = save_tiny(tmp_path / "tiny")
    grp = group(name, bits=bits, steps=4, ranks=(4, 8, 2))
    train = tiny_sft_dataset(16, seed=0)
    exp = Experiment(f"q{bits}-packed", experiment_path=tmp_path)
    exp.run_fit(grp, quantized_create_model, train, None, num_chunks=2, seed=SEED, packing=True)
    ex = exp.session.executor
    assert ex.packs is not None
    fused = [(d.fused_steps, d.alone_steps) for d in ex.packs._drivers.values()]
    mine: dict[int, Any] = {
        rid: adapter_state(r.worker.trainer.model, adapter_name=r.adapter) for rid, r in ex.runs.items()
    }
    info = exp.get_runs_info().set_index("run_id")
    exp.end()
    assert list(info.status) == ["COMPLETED"] * 3 and list(info["pack"]) == [1, 1, 1]
    assert fused == [(4, 0)]
    for rid, leaf in enumerate(grp.expand(SEED), start=1):
        ref = train_plain_trl(leaf, quantized_create_model, train, None, SEED, tmp_path / f"plain-{rid}")
        assert max_abs_diff(mine[rid], ref.final) == 0.0, rid
        assert max_abs_diff(mine[rid], ref.initial) > 0.0, rid
