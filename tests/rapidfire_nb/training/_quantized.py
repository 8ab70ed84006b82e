"""The tiny model, saved once, loaded the way the seeds' recipe loads a large one: ``from_pretrained`` with a
``BitsAndBytesConfig`` in ``model_kwargs`` (shared by the quantized-base tests and their kill-test child).

``python _quantized.py <folder> <experiments_root> <name> [<k>]``: the kill test's child; trains the two-run 4-bit
experiment and, with ``k``, freezes inside the k-th training step (writing ``<folder>/frozen``) for the parent's
SIGKILL.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")


def save_tiny(folder: Path) -> str:
    """Save the tiny Llama and its tokenizer into ``folder`` (once); returns the folder as ``model_name``."""
    from rapidfire_nb.testing import tiny_create_model

    if not (folder / "config.json").is_file():
        model, tok = tiny_create_model()
        model.save_pretrained(str(folder))
        tok.save_pretrained(str(folder))
    return str(folder)


def quantized_create_model(model_config: dict[str, Any]) -> tuple[Any, Any]:
    """``create_model_fn`` as the seeds write it: ``from_pretrained(model_name, **model_kwargs)``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = model_config["model_name"]
    model = AutoModelForCausalLM.from_pretrained(name, **model_config["model_kwargs"])
    return model, AutoTokenizer.from_pretrained(name)


def bnb(bits: int) -> Any:
    """The seeds' 4-bit recipe (NF4, double quantization, bf16 compute), or plain 8-bit."""
    import torch
    from transformers import BitsAndBytesConfig

    if bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=True,
        bnb_4bit_quant_type="nf4",
    )


def group(model_name: str, bits: int = 4, steps: int = 4, ranks: tuple[int, ...] = (4, 8)) -> Any:
    """LoRA runs (one per rank, each its own learning rate) on one quantized base."""
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    return RFGridSearch(
        List(
            [
                RFModelConfig(
                    model_name=model_name,
                    model_kwargs={"quantization_config": bnb(bits), "device_map": "auto"},
                    peft_config=RFLoraConfig(
                        r=r, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]
                    ),
                    training_args=RFSFTConfig(
                        max_steps=steps,
                        per_device_train_batch_size=4,
                        learning_rate=1e-3 * (i + 1),
                        logging_steps=1,
                        max_length=64,
                    ),
                )
                for i, r in enumerate(ranks)
            ]
        ),
        "SFT",
    )


def _freeze_at(k: int, marker: Path) -> None:
    from trl import SFTTrainer

    orig = SFTTrainer.compute_loss
    count = [0]

    def compute_loss(self: Any, *a: Any, **kw: Any) -> Any:
        out = orig(self, *a, **kw)
        if self.model.training:
            count[0] += 1
            if count[0] == k:
                from rapidfire_nb.experiment.registry import current_experiment

                current_experiment().session.recorder.flush(30)
                marker.write_text(str(self.state.global_step))
                time.sleep(600)  # the parent SIGKILLs us here
                os._exit(3)  # pragma: no cover
        return out

    SFTTrainer.compute_loss = compute_loss


def main() -> None:
    import torch

    torch.set_num_threads(1)
    folder, root, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    if len(sys.argv) > 4:
        _freeze_at(int(sys.argv[4]), folder / "frozen")
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_sft_dataset

    exp = Experiment(name, experiment_path=root)
    exp.run_fit(
        group(save_tiny(folder), steps=6),
        quantized_create_model,
        tiny_sft_dataset(24, seed=0),
        num_chunks=3,
        seed=11,
        background=False,
    )
    exp.end()


if __name__ == "__main__":
    main()
