"""The training layer: the only place that imports torch, transformers, trl and peft."""
