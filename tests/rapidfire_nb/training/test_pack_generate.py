"""One batched, sampled ``generate`` for the runs of a pack gives each run the token ids it gets alone (issue 39
part 2), on the tiny model, CPU fp32: each run's rows through its own adapter (LoRA dropout on, in training mode,
as in GRPO's rollouts), each run's samples from its own random state, and a run whose rows have all ended draws
nothing more (its output cut where its own ``generate`` stops) while the other run goes on.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rapidfire_nb.testing import tiny_create_model
from rapidfire_nb.training.pack_generate import generate_together, joinable_generate
from rapidfire_nb.training.pack_rows import Rows
from rapidfire_nb.training.rng import capture_rng, restore_rng

# a quarter of the tiny vocabulary ends a sequence: rows end after a few tokens, at different steps
EOS = list(range(0, 512, 4))


def _model() -> Any:
    from peft import LoraConfig, get_peft_model

    model, _tok = tiny_create_model()
    lora = LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.2, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    model = get_peft_model(model, lora, adapter_name="a")
    model.add_adapter(
        "b",
        LoraConfig(
            r=8, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], init_lora_weights=False
        ),
    )
    model.train()  # GRPO generates with the model in training mode: dropout draws
    return model


def _config(max_new_tokens: int) -> Any:
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=True, temperature=1.0, max_new_tokens=max_new_tokens, eos_token_id=EOS, pad_token_id=1
    )


def _alone(
    model: Any, adapter: str, ids: Any, rng: dict[str, Any], config: Any
) -> tuple[Any, dict[str, Any]]:
    from rapidfire_nb.training.adapters import activate_adapter

    activate_adapter(model, adapter)
    restore_rng(rng)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out, capture_rng()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_each_run_gets_its_own_token_ids_and_random_state(seed: int) -> None:
    from rapidfire_nb.training.packing import PackDriver

    model = _model()
    driver = PackDriver(model)  # installs the per-row routing on the LoRA layers
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(5, 500, (2, 7), generator=gen) for _ in range(2)]
    torch.manual_seed(100 + seed)
    states = [capture_rng()]
    torch.manual_seed(200 + seed)
    states.append(capture_rng())
    config = _config(max_new_tokens=12)
    alone = [_alone(model, ab, p, dict(s), config) for ab, p, s in zip("ab", prompts, states)]
    calls = [
        {"input_ids": p, "attention_mask": torch.ones_like(p), "generation_config": config} for p in prompts
    ]
    assert joinable_generate(calls)
    route = [Rows("a", 0, 2, dict(states[0])), Rows("b", 2, 4, dict(states[1]))]
    together = generate_together(driver._generate_original, calls, route)
    for (want, want_rng), got, rows in zip(alone, together, route):
        assert torch.equal(got, want), (got, want)
        assert torch.equal(rows.rng["cpu"], want_rng["cpu"])  # it drew exactly what it draws alone
    lengths = [int(w.shape[1]) for w, _ in alone]
    if seed == 0:
        assert lengths[0] != lengths[1], "the seed gives runs of different lengths (one finishes first)"


def test_calls_that_cannot_share_one_generate() -> None:
    ids = torch.ones((2, 5), dtype=torch.long)
    base = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "generation_config": _config(4)}
    assert joinable_generate([base, dict(base)])
    assert not joinable_generate([base, {**base, "generation_config": _config(5)}])  # other settings
    assert not joinable_generate(
        [base, {**base, "input_ids": torch.ones((2, 6), dtype=torch.long)}]
    )  # other length
    greedy = _config(4)
    greedy.do_sample = False
    assert not joinable_generate([{**base, "generation_config": greedy}] * 2)


def test_groups_of_calls_that_share_one_generate_fit_the_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal settings join; other settings generate apart; the KV caches of a group fit half the free memory
    (each run's cache estimated at 1,000 bytes: half of 4,000 free holds 2 runs per generate)."""
    from rapidfire_nb.training import free_memory, generation_batch
    from rapidfire_nb.training.pack_generate import generate_groups

    model, _tok = tiny_create_model()
    ids = torch.ones((2, 5), dtype=torch.long)
    call = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "generation_config": _config(4)}
    other = {**call, "generation_config": _config(6)}
    calls = {1: call, 2: dict(call), 3: other, 4: dict(call)}
    assert generate_groups(model, calls) == [[1, 2, 4], [3]]
    monkeypatch.setattr(generation_batch, "kv_cache_bytes", lambda *a: 1000)
    monkeypatch.setattr(free_memory, "available_ram", lambda: 4000)
    assert generate_groups(model, calls) == [[1, 2], [4], [3]]
