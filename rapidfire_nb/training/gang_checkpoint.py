"""Chunk-boundary checkpoints of a run trained by a gang: each rank keeps its own share, no two ranks write one path.

Layout (``k`` ranks, step ``s``)::

    <run_dir>/checkpoint-<s>/                   rank 0 (complete only once every rank's share is on disk)
        adapter_model.safetensors | model.safetensors   rank 0's local shards of the trainable parameters
        optimizer.pt                                     rank 0's optimizer state (local shards)
        rng_state_0.pth                                  rank 0's RNG (the name transformers reads per process)
        scheduler.pt, trainer_state.json, training_args.bin, rapidfire_state.json, adapter_config.json | config.json
        gang.json                                        {"world_size": k, "step": s}
        COMPLETE
    <run_dir>/gang-rank<r>/checkpoint-<s>/      rank r >= 1: the same three share files (rng_state_<r>.pth) + COMPLETE

Trainable parameters are saved as each rank's local tensors (``DTensor.to_local()``; a DDP replica saves its full
copy) under their names (a LoRA run's as PEFT names them, without the adapter's name: :func:`trainable`); a resume loads them back into the same sharding (the same ``num_gpus`` and plan), so a
resumed run continues exactly. Rank ``r`` writes its share at once; rank 0 writes its folder after the kernel
recorded the metrics before it (the writer's order token) and marks it complete only when every other rank's
share of that step is complete. A rank keeps its older shares until rank 0 completes a newer step, so a crash at
any point leaves one complete step on every rank. The final weights are not here: they are gathered into a plain
``save_pretrained`` folder (``rapidfire_nb.training.gang``).
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from rapidfire_nb._atomic import COMPLETE_MARKER, atomic_dir, is_complete_dir
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.run_folder import CHECKPOINT_PREFIX, latest_checkpoint

from .checkpoint import COUNTERS_FILE, TRAINER_COUNTERS, BoundarySnapshot, _without_secrets, frozen_state
from .rng import rng_for_checkpoint
from .sharding import Gang

__all__ = [
    "GangLayout",
    "GangSnapshotter",
    "check_share_width",
    "copy_shares",
    "install_gang_resume",
    "share_folder",
    "trainable",
]

_LOCAL_KEYS = "rf_local_state"  # optimizer.pt: the (param index, key) pairs that were DTensors


def share_folder(checkpoint: Path, rank: int) -> Path:
    """Where rank ``rank``'s share of ``checkpoint`` (``<run_dir>/checkpoint-<s>``) lives."""
    checkpoint = Path(checkpoint)
    return checkpoint if rank == 0 else checkpoint.parent / f"gang-rank{rank}" / checkpoint.name


def _local(t: Any) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _local_optimizer(state: dict[str, Any]) -> dict[str, Any]:
    """A private copy of an optimizer ``state_dict`` with its DTensors as local tensors (their places listed)."""
    from torch.distributed.tensor import DTensor

    local: list[list[Any]] = []
    out: dict[str, Any] = {"param_groups": copy.deepcopy(state["param_groups"]), "state": {}}
    for idx, values in state["state"].items():
        copied = {}
        for key, value in values.items():
            if isinstance(value, DTensor):
                local.append([idx, key])
            copied[key] = (
                _local(value).detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
            )
        out["state"][idx] = copied
    out[_LOCAL_KEYS] = local
    return out


class GangSnapshotter:
    """A gang rank's boundary snapshots: its local shards of the trainable parameters and of the optimizer state,
    the scheduler, its RNG, the trainer state (what :class:`GangLayout` writes). Same interface as
    :class:`~rapidfire_nb.training.checkpoint.Snapshotter` (``take``, ``drop_spares``, ``spares``).

    Args:
        run_id: the run.
        trainer: its TRL trainer (model sharded by FSDP2, or a DDP replica).
        adapter_name: its adapter (None: full fine-tuning).
        gang: this process's place in the gang.
    """

    def __init__(self, run_id: int, trainer: Any, adapter_name: str | None, gang: Gang) -> None:
        self.run_id = run_id
        self.trainer = trainer
        self.layout = GangLayout(gang, adapter_name is not None)
        self.reused = 0
        model = trainer.model
        self._params = trainable(model, adapter_name)
        adapter_config = copy.deepcopy(model.peft_config[adapter_name]) if adapter_name is not None else None
        model_config = copy.deepcopy(model.config) if adapter_name is None else None
        self._fixed = (adapter_config, model_config, _without_secrets(copy.deepcopy(trainer.args)))

    def drop_spares(self) -> int:
        return 0

    @property
    def spares(self) -> int:
        return 0

    def take(self, rng: dict[str, Any]) -> BoundarySnapshot:
        """This rank's resumable state now (tensors are private copies); ``rng`` is kept as it is."""
        trainer = self.trainer
        adapter_config, model_config, training_args = self._fixed
        return BoundarySnapshot(
            run_id=self.run_id,
            step=int(trainer.state.global_step),
            weights={n: _local(p).detach().clone() for n, p in self._params},
            adapter_config=adapter_config,
            model_config=model_config,
            optimizer=_local_optimizer(trainer.optimizer.state_dict()),
            scheduler=copy.deepcopy(trainer.lr_scheduler.state_dict()),
            rng=rng,
            trainer_state=frozen_state(trainer.state),
            training_args=training_args,
            counters={n: _number(getattr(trainer, n)) for n in TRAINER_COUNTERS if hasattr(trainer, n)},
            layout=self.layout,
        )


def _number(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) else value


class GangLayout:
    """Writes one rank's share of a boundary checkpoint and removes its own older ones (see the module).

    Args:
        gang: this process's place in the gang.
        lora: the run trains a LoRA adapter (its weights file is ``adapter_model.safetensors``).
    """

    def __init__(self, gang: Gang, lora: bool) -> None:
        self.gang = gang
        self.weights_file = "adapter_model.safetensors" if lora else "model.safetensors"

    def write(self, snap: BoundarySnapshot, target: Path) -> None:
        """Write this rank's share of ``target`` (``<run_dir>/checkpoint-<s>``).

        Raises:
            OSError: a write failed. TimeoutError: another rank's share did not appear in time (rank 0).
            RuntimeError: rank 0 left the step out: another rank had already written a newer one instead (its
                snapshot of this step was replaced before being written; the newer checkpoint follows).
        """
        folder = share_folder(target, self.gang.rank)
        with atomic_dir(folder) as tmp:
            tmp = Path(tmp)
            save_file({k: v.contiguous() for k, v in snap.weights.items()}, str(tmp / self.weights_file))
            torch.save(snap.optimizer, tmp / "optimizer.pt")
            torch.save(rng_for_checkpoint(snap.rng), tmp / f"rng_state_{self.gang.rank}.pth")
            if self.gang.rank == 0:
                self._shared_files(snap, tmp)
                if not self._others_ready(target, snap.step):
                    raise _Skipped(f"step {snap.step} left out: another rank went past it")

    def _shared_files(self, snap: BoundarySnapshot, tmp: Path) -> None:
        if snap.adapter_config is not None:
            snap.adapter_config.save_pretrained(str(tmp))
        else:
            snap.model_config.save_pretrained(str(tmp))
        torch.save(snap.scheduler, tmp / "scheduler.pt")
        (tmp / "trainer_state.json").write_text(snap.trainer_state_json())
        (tmp / COUNTERS_FILE).write_text(json.dumps({"counters": snap.counters}) + "\n")
        torch.save(snap.training_args, tmp / "training_args.bin")
        (tmp / "gang.json").write_text(
            json.dumps({"world_size": self.gang.world_size, "step": snap.step}) + "\n"
        )

    def _others_ready(self, target: Path, step: int) -> bool:
        """Wait until every other rank's share of ``step`` is complete (True), or one of them wrote a newer step
        instead (False: its snapshot of ``step`` was replaced before being written)."""
        deadline = time.monotonic() + max(self.gang.timeout_s, 60.0)
        pending = list(range(1, self.gang.world_size))
        while pending:
            rank = pending[0]
            if is_complete_dir(share_folder(target, rank)):
                pending.pop(0)
                continue
            if _newest_step(share_folder(target, rank).parent) > step:
                return False
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"rank {rank}'s checkpoint share of step {step} did not appear in {target.parent}"
                )
            time.sleep(0.02)
        return True

    def save(self, snap: BoundarySnapshot, run_dir: Path, target: Path) -> bool:
        """The checkpoint writer's call: :meth:`write`, then :meth:`clean`; False when the step was left out."""
        try:
            self.write(snap, target)
        except _Skipped:
            return False
        self.clean(run_dir, target)
        return True

    def clean(self, run_dir: Path, target: Path) -> None:
        """Remove this rank's own older shares: rank 0 every other checkpoint folder; rank r the shares older than
        rank 0's latest complete checkpoint (kept until then: a crash may resume from it)."""
        if self.gang.rank == 0:
            for old in run_dir.glob(f"{CHECKPOINT_PREFIX}*"):
                if old != target and not old.name.startswith("."):
                    shutil.rmtree(old, ignore_errors=True)
            return
        latest = latest_checkpoint(run_dir)
        keep = _step(latest) if latest is not None else -1
        mine = share_folder(target, self.gang.rank)
        for old in mine.parent.glob(f"{CHECKPOINT_PREFIX}*"):
            if old != mine and not old.name.startswith(".") and 0 <= _step(old) < keep:
                shutil.rmtree(old, ignore_errors=True)


class _Skipped(RuntimeError):
    """Rank 0 leaves a step out (see :meth:`GangLayout.write`); the atomic folder is discarded."""


def _step(folder: Path) -> int:
    try:
        return int(folder.name.rsplit("-", 1)[1])
    except (ValueError, IndexError):
        return -1


def _newest_step(folder: Path) -> int:
    latest = latest_checkpoint(folder)
    return _step(latest) if latest is not None else -1


def trainable(model: Any, adapter: str | None) -> list[tuple[str, Any]]:
    """The model's trainable parameters by the names a share stores: a LoRA run's as PEFT saves them (without the
    adapter's name: ``...q_proj.lora_A.weight``), so a share fits any adapter name; full fine-tuning's as named."""
    infix = f".{adapter}." if adapter is not None else None
    return [
        (n.replace(infix, ".") if infix is not None else n, p)
        for n, p in model.named_parameters()
        if p.requires_grad
    ]


def install_gang_resume(trainer: Any, gang: Gang, adapter: str | None) -> None:
    """Make ``trainer.train(resume_from_checkpoint=<run_dir>/checkpoint-<s>)`` load this rank's share.

    Replaces (on this trainer only) transformers' ``_load_from_checkpoint`` (this rank's local parameter shards,
    copied into the live ``DTensor``'s local tensors), ``_load_optimizer_and_scheduler`` (its optimizer state, put
    back as ``DTensor``s on the live parameters' mesh; the shared scheduler) and ``_load_rng_state`` (its own
    ``rng_state_<rank>.pth``). The trainer state (``trainer_state.json``: global step, data position) is read
    by transformers from rank 0's folder as for any run.
    """
    weights_file = "adapter_model.safetensors" if adapter is not None else "model.safetensors"
    original_rng = trainer._load_rng_state

    def load_model(checkpoint: str, model: Any = None) -> None:
        saved = load_file(str(share_folder(Path(checkpoint), gang.rank) / weights_file))
        params = dict(trainable(trainer.model, adapter))
        missing = [n for n in params if n not in saved]
        if missing or set(saved) - set(params):
            raise RuntimeError(
                f"checkpoint {checkpoint} does not fit the run's model (missing: {missing[:3]})"
            )
        with torch.no_grad():
            for name, tensor in saved.items():
                _local(params[name]).copy_(tensor)

    def load_optimizer_and_scheduler(checkpoint: str | None) -> None:
        if checkpoint is None:
            return
        share = share_folder(Path(checkpoint), gang.rank)
        state = torch.load(share / "optimizer.pt", map_location="cpu", weights_only=True)
        trainer.optimizer.load_state_dict(_as_dtensors(state, trainer.optimizer))
        trainer.lr_scheduler.load_state_dict(torch.load(Path(checkpoint) / "scheduler.pt", weights_only=True))

    def load_rng(checkpoint: str | None) -> None:
        original_rng(None if checkpoint is None else str(share_folder(Path(checkpoint), gang.rank)))

    trainer._load_from_checkpoint = load_model
    trainer._load_optimizer_and_scheduler = load_optimizer_and_scheduler
    trainer._load_rng_state = load_rng


def _as_dtensors(state: dict[str, Any], optimizer: Any) -> dict[str, Any]:
    """A saved local optimizer state with its listed tensors made ``DTensor``s like their parameters."""
    from torch.distributed.tensor import DTensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    for idx, key in state.pop(_LOCAL_KEYS, []):
        p = params[int(idx)]
        state["state"][idx][key] = DTensor.from_local(
            state["state"][idx][key].to(_local(p).device),
            p.device_mesh,
            p.placements,
            run_check=False,
            shape=p.size(),
            stride=p.stride(),
        )
    return state


def _width(checkpoint: Path) -> int:
    """How many ranks' shares make up ``checkpoint``: its ``gang.json``'s ``world_size``; 1 without one (a
    one-device run's whole state)."""
    gang_file = Path(checkpoint) / "gang.json"
    return int(json.loads(gang_file.read_text())["world_size"]) if gang_file.is_file() else 1


def check_share_width(parent_id: int, checkpoint: Path, width: int) -> None:
    """Refuse a warm start from ``checkpoint`` (run ``parent_id``'s state on disk) by a clone of another width, or
    from a sharded state with a rank's share missing. The same answer on every rank of the clone's gang.

    Args:
        parent_id: the parent's run id (named in the messages).
        checkpoint: the parent's ``<run_dir>/checkpoint-<s>`` (rank 0's folder for a gang).
        width: the clone's ``num_gpus`` (its gang's world size; 1 for one device).

    Raises:
        ConfigError: the widths differ (a state sharded ``k`` ways is read back only by ``k`` ranks sharded the same
            way; a whole state is not split), or a rank's share is not complete on disk.
    """
    saved = _width(checkpoint)
    if saved != width and saved > 1:
        raise ConfigError(
            f"run {parent_id} trained over {saved} devices (num_gpus={saved}) and its state on disk is sharded "
            f"{saved} ways: a warm clone of it from disk trains over {saved} devices too (this one: num_gpus="
            f"{width}); clone it cold, or with num_gpus={saved}"
        )
    if saved != width:
        raise ConfigError(
            f"run {parent_id} trained on one device: a warm clone of it from its state on disk trains on one "
            f"device too (this one: num_gpus={width}); clone it cold, or with num_gpus=1"
        )
    for rank in range(1, saved):
        if not is_complete_dir(share_folder(checkpoint, rank)):
            raise ConfigError(
                f"run {parent_id}'s state on disk lacks rank {rank}'s share ({share_folder(checkpoint, rank)}); "
                "clone it cold"
            )


def copy_shares(
    parent_id: int, checkpoint: Path, target: Path, gang: Gang, model: Any, adapter: str | None
) -> None:
    """Copy this rank's share of a parent's sharded ``checkpoint`` into its share of ``target`` (a clone's
    ``<run_dir>/warm-start-from-run-<parent>-step-<s>``), the layout :func:`install_gang_resume` reads.

    Rank 0 copies its folder (shared files included) with the clone's own adapter config written over the
    parent's, and completes it only once every other rank's copy is complete (as :class:`GangLayout` does).

    Args:
        parent_id: the parent's run id; ``checkpoint`` its ``checkpoint-<s>`` (checked by
            :func:`check_share_width`).
        target: the clone's warm-start folder (rank 0's); ``gang``: this process's place in the clone's gang.
        model: the clone's sharded model; ``adapter`` its adapter name (None: full fine-tuning).

    Raises:
        ConfigError: the share does not fit the clone's model (another sharding, e.g. DDP's whole replicas into
            FSDP shards, or another adapter shape). TimeoutError: another rank's copy did not appear in time
            (rank 0). OSError: a copy failed.
    """
    source = share_folder(checkpoint, gang.rank)
    _check_share_fits(parent_id, source, model, adapter)
    with atomic_dir(share_folder(target, gang.rank)) as tmp:
        for item in source.iterdir():
            if item.is_file() and item.name != COMPLETE_MARKER:  # atomic_dir writes its own, last
                shutil.copy2(item, Path(tmp) / item.name)
        if gang.rank == 0:
            if adapter is not None:  # the clone's own lora_alpha / lora_dropout
                model.peft_config[adapter].save_pretrained(str(tmp))
            _wait_for_shares(target, gang)


def _check_share_fits(parent_id: int, share: Path, model: Any, adapter: str | None) -> None:
    from safetensors import safe_open

    weights = share / ("adapter_model.safetensors" if adapter is not None else "model.safetensors")
    with safe_open(str(weights), framework="pt") as f:
        saved = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 - not a dict
    own = {name: tuple(_local(p).shape) for name, p in trainable(model, adapter)}
    if saved != own:
        wrong = sorted(n for n in set(saved) | set(own) if saved.get(n) != own.get(n))
        raise ConfigError(
            f"run {parent_id}'s checkpoint share {share} does not fit the clone's model ({wrong[0]}: saved "
            f"{saved.get(wrong[0])}, the clone's {own.get(wrong[0])}): a warm clone from disk needs the parent's "
            "sharding (fsdp settings) and adapter shape; clone it cold"
        )


def _wait_for_shares(target: Path, gang: Gang) -> None:
    """Wait until every other rank's share of ``target`` is complete (rank 0, before completing its own)."""
    deadline = time.monotonic() + max(gang.timeout_s, 60.0)
    for rank in range(1, gang.world_size):
        while not is_complete_dir(share_folder(target, rank)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank}'s share of {target.name} did not appear in {target.parent}")
            time.sleep(0.02)
