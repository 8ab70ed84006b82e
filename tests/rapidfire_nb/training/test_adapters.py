"""``activate_adapter``: the same trainable weights and active adapters as PEFT's ``set_adapter``, switch by switch."""

from __future__ import annotations

from typing import Any

import pytest

from rapidfire_nb.testing import tiny_create_model
from rapidfire_nb.training.adapters import activate_adapter


def _lora(r: int, targets: list[str], **extra: Any) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, task_type="CAUSAL_LM", **extra)


def _model() -> Any:
    from peft import get_peft_model

    model, _ = tiny_create_model({"model_name": "tiny"})
    model = get_peft_model(model, _lora(2, ["q_proj", "v_proj"]), adapter_name="run_1")
    model.add_adapter("run_2", _lora(4, ["q_proj", "v_proj"]))
    return model


def _state(model: Any) -> tuple[dict[str, bool], str, Any, list[Any]]:
    """What a switch decides: each weight's requires_grad, and every place that names the active adapter."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    grads = {name: p.requires_grad for name, p in model.named_parameters()}
    layers = [m.active_adapters for m in model.modules() if isinstance(m, BaseTunerLayer)]
    return grads, model.active_adapter, model.base_model.active_adapter, layers


def _same_as_peft(model: Any, twin: Any, adapter: str) -> None:
    activate_adapter(model, adapter)
    twin.set_adapter(adapter)
    got, want = _state(model), _state(twin)
    assert got == want
    assert got[1] == adapter and sum(got[0].values()) > 0


def test_every_switch_matches_set_adapter_also_after_adapters_come_and_go() -> None:
    model, twin = _model(), _model()
    for adapter in ("run_2", "run_1", "run_2"):
        _same_as_peft(model, twin, adapter)
    # a third adapter on more modules (new adapter layers on k_proj / o_proj): the cached layer list is rebuilt
    for m in (model, twin):
        m.add_adapter("run_3", _lora(8, ["q_proj", "k_proj", "v_proj", "o_proj"]))
    for adapter in ("run_3", "run_1", "run_3"):
        _same_as_peft(model, twin, adapter)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".run_3." in n for n in trainable)
    assert any("k_proj.lora_A.run_3" in n for n in trainable)
    # an adapter deleted and added again under its name (a run back on this device): a new config, a new list
    for m in (model, twin):
        m.delete_adapter("run_1")
        m.add_adapter("run_1", _lora(2, ["q_proj", "k_proj"]))
    for adapter in ("run_1", "run_2", "run_1"):
        _same_as_peft(model, twin, adapter)
    assert any("k_proj.lora_A.run_1" in n for n, p in model.named_parameters() if p.requires_grad)


def test_modules_to_save_goes_through_peft_itself() -> None:
    from peft import get_peft_model

    def build() -> Any:
        model, _ = tiny_create_model({"model_name": "tiny"})
        model = get_peft_model(model, _lora(2, ["q_proj"], modules_to_save=["lm_head"]), adapter_name="run_1")
        model.add_adapter("run_2", _lora(2, ["q_proj"], modules_to_save=["lm_head"]))
        return model

    model, twin = build(), build()
    for adapter in ("run_2", "run_1"):
        _same_as_peft(model, twin, adapter)
    assert any("modules_to_save.run_1" in n for n, p in model.named_parameters() if p.requires_grad)


def test_an_unknown_adapter_is_refused_as_peft_does() -> None:
    model = _model()
    before = _state(model)
    with pytest.raises(ValueError, match="Adapter run_9 not found"):
        activate_adapter(model, "run_9")
    assert _state(model) == before  # nothing changed
