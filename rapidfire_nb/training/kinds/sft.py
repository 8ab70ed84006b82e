"""SFT: ``trl.SFTTrainer`` / ``trl.SFTConfig``. Every hook is the default one."""

from __future__ import annotations

from typing import ClassVar

from .base import COMMON_WARM_FORBIDDEN, TrainerKind

__all__ = ["SFTKind"]


class SFTKind(TrainerKind):
    """Supervised fine-tuning on prompt/completion pairs, conversations or plain text."""

    name = "SFT"
    trainer_class_name = "SFTTrainer"
    required_columns = (("prompt", "completion"), ("messages",), ("text",))
    warm_forbidden: ClassVar[tuple[str, ...]] = (*COMMON_WARM_FORBIDDEN, "packing")
