"""The run spec: one fully resolved run (``LeafConfig``), its JSON form, and its real TRL/PEFT configs.

Layering: ``errors`` -> ``schema`` -> ``spec`` -> {``automl``, ``training``}. ``automl`` expands a config group
into ``LeafConfig`` objects; ``training`` trains them; neither imports the other, both import this package.
Importing it is cheap (standard library only); ``LeafConfig.validate``/``with_changes`` and
``build_training_args``/``build_lora_config`` import trl/peft/torch when called.
"""

from __future__ import annotations

from .build import TrainerSettings, build_lora_config, build_training_args, detect_bf16, detect_cuda
from .leaf import FUNCTION_KEYS, REF_MODEL_TRAINERS, REWARD_FUNCS_TRAINERS, LeafConfig
from .values import Knob, check_model_field, deep_copy, find_knob, jsonable

__all__ = [
    "FUNCTION_KEYS",
    "REF_MODEL_TRAINERS",
    "REWARD_FUNCS_TRAINERS",
    "Knob",
    "LeafConfig",
    "TrainerSettings",
    "build_lora_config",
    "build_training_args",
    "check_model_field",
    "deep_copy",
    "detect_bf16",
    "detect_cuda",
    "find_knob",
    "jsonable",
]
