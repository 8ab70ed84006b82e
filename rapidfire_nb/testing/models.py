"""Tiny random models, tokenizer and datasets for fast tests and benchmarks.

Nothing here reads a file or touches the network: the tokenizer is a byte-level BPE trained in memory by
the ``tokenizers`` library on a fixed built-in corpus (~0.05 s), and the model is a randomly initialised
``LlamaForCausalLM`` (or ``Qwen2ForCausalLM``) with 64 hidden units and 2 layers (~0.1 M parameters). A
TRL SFT/DPO/GRPO step on it takes 0.03-0.12 s on a CPU. Everything is deterministic: the same arguments
give the same vocabulary, the same weights and the same rows, in any process, and building a model does
not move the caller's random number generators.

``import rapidfire_nb.testing.models`` imports neither torch nor transformers; they are imported on first use.

Typical use::

    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

    model, tokenizer = tiny_create_model()
    train = tiny_sft_dataset(32)
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = [
    "TINY_CHAT_TEMPLATE",
    "TINY_MODEL_NAMES",
    "TINY_SIZES",
    "TINY_SPECIAL_TOKENS",
    "TINY_VOCAB_SIZE",
    "length_reward",
    "tiny_create_model",
    "tiny_dpo_dataset",
    "tiny_grpo_dataset",
    "tiny_model",
    "tiny_model_config",
    "tiny_sft_dataset",
    "tiny_tokenizer",
]

TINY_VOCAB_SIZE = 512
"""Vocabulary size of :func:`tiny_tokenizer` (256 byte symbols + 4 special tokens + 252 merges)."""

TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>")
"""Special tokens of :func:`tiny_tokenizer`, with ids 0, 1, 2, 3 in this order."""

TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML, as SmolLM2's template but without its default system message (shorter test sequences)."""

TINY_MODEL_NAMES = ("tiny", "tiny-llama", "tiny-qwen2")
"""``model_name`` values :func:`tiny_create_model` accepts (``"tiny"`` is ``"tiny-llama"``)."""

TINY_SIZES: Mapping[str, int] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
"""The tiny models' config sizes (:func:`tiny_model`'s defaults)."""


def tiny_model_config(model_name: str = "tiny") -> dict[str, Any]:
    """The config fields of the model :func:`tiny_create_model` builds for ``model_name``, without building it
    (torch-free: what ``rapidfire_nb.spec.footprint`` sizes a run from).

    Raises:
        ValueError: ``model_name`` is not one of :data:`TINY_MODEL_NAMES`.
    """
    if model_name not in TINY_MODEL_NAMES:
        raise ValueError(f"tiny models are {list(TINY_MODEL_NAMES)}, got model_name={model_name!r}.")
    model_type = "qwen2" if model_name == "tiny-qwen2" else "llama"
    return {
        "model_type": model_type,
        **TINY_SIZES,
        "vocab_size": TINY_VOCAB_SIZE,
        "tie_word_embeddings": False,
    }


# Fixed training corpus of the tiny tokenizer. Changing it changes every tiny vocabulary and model:
# keep it as it is (tests compare against values derived from it).
_CORPUS = (
    "My internet is not working. Restart your router and check if the cables are connected properly.",
    "My computer won't turn on. Check if it's plugged in and hold the power button for 10 seconds.",
    "My printer is not printing. Ensure it's powered on and has paper, then restart it.",
    "I forgot my password. Use the password reset option or contact your admin.",
    "My screen is flickering. Update the graphics driver or check the monitor cable.",
    "You are a helpful assistant. Answer the question in one short sentence.",
    "What is the capital of France? The capital of France is Paris.",
    "What is 3 plus 4? The answer is 7. What is 12 minus 5? The answer is 7.",
    "How many apples are left if you have 10 and eat 3? There are 7 apples left.",
    "<reasoning>Add the two numbers together.</reasoning><answer>42</answer>",
    "The quick brown fox jumps over the lazy dog. A red apple, a green pear and a yellow banana.",
    "Please describe the colour of the sky. The sky is blue on a clear day and grey when it rains.",
    "one two three four five six seven eight nine ten eleven twelve twenty thirty hundred thousand",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 30 40 50 64 99 100 128 256 512 1000",
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June",
    "Thank you for your help! You're welcome. Is there anything else I can do for you today?",
    "The model learns from examples; the trainer updates its weights after every optimizer step.",
    "Good answers are short, correct and polite. Bad answers are long, wrong or rude.",
    "system user assistant question answer prompt completion chosen rejected reward",
)

_COLOURS = ("red", "blue", "green", "yellow", "black", "white", "orange", "purple")
_ANIMALS = ("cat", "dog", "fox", "bird", "fish", "horse", "mouse", "cow")


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    """Train the tiny BPE once per process and return its serialised form."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeating the corpus gives enough pair counts for all 252 merges.
    tok.train_from_iterator(list(_CORPUS) * 4, trainer=trainer)
    if tok.get_vocab_size() != TINY_VOCAB_SIZE:  # pragma: no cover - guards a corpus edit
        raise RuntimeError(f"tiny tokenizer has {tok.get_vocab_size()} tokens, expected {TINY_VOCAB_SIZE}")
    return tok.to_str()


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Build the tiny byte-level BPE tokenizer with a ChatML chat template.

    The vocabulary (512 tokens) is trained in memory on a fixed built-in corpus, so every call and every
    process gets the same token ids. Special tokens: ``<|endoftext|>`` (id 0, unk/bos), ``<|im_start|>``
    (1), ``<|im_end|>`` (2, eos, ends every chat turn) and ``<pad>`` (3, pad). ``model_max_length`` is
    512 tokens. Each call returns a new object (the training itself is done once per process).

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with ``chat_template`` = :data:`TINY_CHAT_TEMPLATE`.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=TINY_CHAT_TEMPLATE,
        model_max_length=512,
        padding_side="right",
    )


def tiny_model(seed: int = 0, arch: str = "llama", sizes: Mapping[str, int] | None = None) -> PreTrainedModel:
    """Build a tiny randomly initialised causal LM whose vocabulary matches :func:`tiny_tokenizer`.

    Sizes: hidden 64, 2 layers, 4 attention heads, 2 KV heads, MLP 128, vocabulary 512, 512 positions,
    untied embeddings, float32, ~0.1 M parameters. The weights depend only on ``seed`` and ``arch``; they
    are drawn inside ``torch.random.fork_rng()``, so the caller's torch (and Python/NumPy) random state is
    the same after the call as before.

    Args:
        seed: torch seed of the initialisation.
        arch: ``"llama"`` (``LlamaForCausalLM``) or ``"qwen2"`` (``Qwen2ForCausalLM``).
        sizes: config sizes that replace the defaults above (``hidden_size``, ``num_hidden_layers``,
            ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``), e.g. the benchmark's larger
            "fast steps" model.

    Returns:
        The model in train mode, on the CPU, with ``config.pad/bos/eos_token_id`` and its
        ``generation_config`` set to the tokenizer's ``<pad>``/``<|endoftext|>``/``<|im_end|>`` ids.

    Raises:
        ValueError: unknown ``arch``.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if arch not in classes:
        raise ValueError(f"arch must be one of {sorted(classes)}, got {arch!r}.")
    config_cls, model_cls = classes[arch]
    special = {name: i for i, name in enumerate(TINY_SPECIAL_TOKENS)}
    dims = {**TINY_SIZES, **(sizes or {})}
    config = config_cls(
        vocab_size=TINY_VOCAB_SIZE,
        **dims,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=special["<pad>"],
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=special["<|im_end|>"],
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        pad_token_id=config.pad_token_id, bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id
    )
    model.train()
    return model


def tiny_create_model(
    model_config: dict[str, Any] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A ``create_model_fn`` for ``Experiment.run_fit`` that returns the tiny model and tokenizer.

    Every call with the same ``model_config`` returns a new model with identical weights (seed 0).

    Args:
        model_config: optional dict; only these keys are read:
            ``model_name``: one of :data:`TINY_MODEL_NAMES` or ``None`` (``"tiny-qwen2"`` builds a Qwen2);
            ``model_kwargs``: ``dtype``/``torch_dtype`` (a ``torch.dtype`` or its name; the model is cast
            to it), ``attn_implementation`` (set on the config), ``use_cache`` (set on the config, as
            ``from_pretrained`` does), ``device_map`` and ``low_cpu_mem_usage`` (loading hints, ignored: the model
            is built on the CPU). Other keys are ignored.

    Returns:
        ``(model, tokenizer)`` from :func:`tiny_model` and :func:`tiny_tokenizer`.

    Raises:
        ValueError: unknown ``model_name``.
        TypeError: an unsupported ``model_kwargs`` key (named in the message).
    """
    import torch

    cfg = dict(model_config or {})
    name = cfg.get("model_name") or "tiny"
    if name not in TINY_MODEL_NAMES:
        raise ValueError(f"tiny_create_model builds only {list(TINY_MODEL_NAMES)}, got model_name={name!r}.")
    arch = "qwen2" if name == "tiny-qwen2" else "llama"
    kwargs = dict(cfg.get("model_kwargs") or {})
    dtype = kwargs.pop("dtype", None)
    torch_dtype = kwargs.pop("torch_dtype", None)
    dtype = dtype if dtype is not None else torch_dtype
    attn = kwargs.pop("attn_implementation", None)
    use_cache = kwargs.pop("use_cache", None)
    kwargs.pop("device_map", None)
    kwargs.pop("low_cpu_mem_usage", None)
    if kwargs:
        raise TypeError(
            f"tiny_create_model does not support model_kwargs {sorted(kwargs)}; supported: dtype, "
            "torch_dtype, attn_implementation, use_cache, device_map, low_cpu_mem_usage."
        )
    model = tiny_model(seed=0, arch=arch)
    if use_cache is not None:
        model.config.use_cache = bool(use_cache)
    if attn is not None:
        model.set_attn_implementation(attn)
    if dtype is not None and dtype != "auto":
        model = model.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    return model, tiny_tokenizer()


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def _sum_rows(n: int, seed: int) -> list[tuple[str, int]]:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}.")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        rows.append((f"What is {a} plus {b}?", a + b))
    return rows


def tiny_sft_dataset(n: int = 32, seed: int = 0) -> Dataset:
    """Short conversational prompt/completion rows for SFT tests.

    Rows alternate between additions ("What is 3 plus 4?" -> "The answer is 7.") and colour questions
    ("What colour is the fox?" -> "The fox is red."), drawn with ``random.Random(seed)``; each row is
    10-25 tiny tokens once templated.

    Args:
        n: number of rows (>= 1).
        seed: seed of the row generator.

    Returns:
        ``datasets.Dataset`` with columns ``prompt`` (``[{"role": "user", ...}]``) and ``completion``
        (``[{"role": "assistant", ...}]``).

    Raises:
        ValueError: ``n < 1``.
    """
    from datasets import Dataset

    rng = random.Random(seed + 1)
    prompts, completions = [], []
    for i, (question, total) in enumerate(_sum_rows(n, seed)):
        if i % 2 == 0:
            prompts.append(_user(question))
            completions.append(_assistant(f"The answer is {total}."))
        else:
            animal, colour = rng.choice(_ANIMALS), rng.choice(_COLOURS)
            prompts.append(_user(f"What colour is the {animal}?"))
            completions.append(_assistant(f"The {animal} is {colour}."))
    return Dataset.from_dict({"prompt": prompts, "completion": completions})


def tiny_dpo_dataset(n: int = 32, seed: int = 0) -> Dataset:
    """Conversational preference rows for DPO tests: a right and a wrong sum.

    Args:
        n: number of rows (>= 1).
        seed: seed of the row generator.

    Returns:
        ``datasets.Dataset`` with columns ``prompt`` (``[user]``), ``chosen`` (``[assistant]``, the
        correct sum) and ``rejected`` (``[assistant]``, a wrong sum; never equal to ``chosen``).

    Raises:
        ValueError: ``n < 1``.
    """
    from datasets import Dataset

    rng = random.Random(seed + 2)
    rows: dict[str, list[Any]] = {"prompt": [], "chosen": [], "rejected": []}
    for question, total in _sum_rows(n, seed):
        wrong = total + rng.choice((-3, -2, -1, 1, 2, 3))
        rows["prompt"].append(_user(question))
        rows["chosen"].append(_assistant(f"The answer is {total}."))
        rows["rejected"].append(_assistant(f"The answer is {wrong}."))
    return Dataset.from_dict(rows)


def tiny_grpo_dataset(n: int = 32, seed: int = 0) -> Dataset:
    """Conversational prompts with an ``answer`` column for GRPO tests.

    TRL passes the ``answer`` column to reward functions as a keyword argument (a list of strings, one
    per completion).

    Args:
        n: number of rows (>= 1).
        seed: seed of the row generator.

    Returns:
        ``datasets.Dataset`` with columns ``prompt`` (``[user]``) and ``answer`` (the sum as a string).

    Raises:
        ValueError: ``n < 1``.
    """
    from datasets import Dataset

    rows = _sum_rows(n, seed)
    return Dataset.from_dict({"prompt": [_user(q) for q, _ in rows], "answer": [str(t) for _, t in rows]})


def _completion_text(completion: Any) -> str:
    """The text of one TRL completion: a string, or a conversational list of messages."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content", "")) for message in completion)


def length_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """A GRPO reward with variance inside a group: the completion's length in characters.

    A random model's completions all get equal rewards from a correctness check (zero advantage, zero
    loss); their lengths differ, so this reward yields a non-zero GRPO gradient in tests.

    Args:
        completions: TRL completions, plain strings or conversational ``[{"role", "content"}]`` lists.
        **kwargs: ignored (TRL passes ``prompts``, dataset columns, ``trainer_state``, ...).

    Returns:
        One float per completion: its number of characters.
    """
    return [float(len(_completion_text(c))) for c in completions]
