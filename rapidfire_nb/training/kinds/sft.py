"""SFT: ``trl.SFTTrainer`` / ``trl.SFTConfig``. Every hook but the row formats is the default one."""

from __future__ import annotations

from typing import ClassVar

from rapidfire_nb.spec import LeafConfig

from ..formats import CHAT, FROM_VALUE, IDS, TEXT, TEXT_OR_CHAT, RowFormat
from .base import COMMON_WARM_FORBIDDEN, TrainerKind, training_value

__all__ = ["SFTKind"]


class SFTKind(TrainerKind):
    """Supervised fine-tuning on prompt/completion pairs, conversations or plain text."""

    name = "SFT"
    trainer_class_name = "SFTTrainer"
    required_columns = (("prompt", "completion"), ("messages",), ("text",))
    warm_forbidden: ClassVar[tuple[str, ...]] = (*COMMON_WARM_FORBIDDEN, "packing")

    def row_formats(self, spec: LeafConfig | None = None) -> tuple[RowFormat, ...]:
        """``SFTTrainer``'s formats in the order it tries them: already tokenized ``input_ids``; ShareGPT
        ``conversations``; ``prompt``/``completion``; ``messages``; the ``dataset_text_field`` column (``text``)."""
        field = training_value(spec, "dataset_text_field") if spec is not None else "text"
        field = field if isinstance(field, str) and field else "text"
        return (
            RowFormat(("input_ids",), IDS),
            RowFormat(("conversations",), FROM_VALUE),
            RowFormat(("prompt", "completion"), TEXT_OR_CHAT),
            RowFormat(("messages",), CHAT),
            RowFormat((field,), TEXT, "dataset_text_field" if field != "text" else ""),
        )
