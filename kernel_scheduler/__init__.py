"""kernel_scheduler: the pure scheduling core of rapidfire_nb (standard library only, no torch).

Run states and their legal transitions, chunk maths, the fairness policy and its placement on several devices,
IC Op rules, early-stopping policies (successive halving and median stopping on chunk rungs) and the loop thread
that drives an :class:`Executor` (single devices and composite ones: a gang of devices training one run,
:mod:`~kernel_scheduler.gangs`).
"""

from .arbiter import DEFAULT_DEVICE, DeviceArbiter, Lease, device_arbiter
from .chunks import ChunkPlan, ChunkPlanError, plan_chunks
from .early_stopping import (
    EARLY_STOPPING,
    ChunkResult,
    Decisions,
    EarlyStop,
    EarlyStoppingPolicy,
    MedianStopping,
    NewRun,
    RunState,
    SuccessiveHalving,
)
from .executor import Executor, RunStart, SegmentResult, check_device
from .gangs import device_parts, device_width, overlaps, single_devices
from .loop import RunSnapshot, Scheduler, SchedulerListener
from .op_kinds import OP_KINDS, OpKindInfo
from .ops import Decision, Op, OpAck, OpKind, OpState, PendingOp, decide, expected_status, new_op_id
from .placement import Assignment, DeviceView, FairPlacement, PlacedRun
from .policy import FurthestBehindFirst, RunView, SchedulingPolicy
from .runs import StopInfo
from .status import TRANSITIONS, IllegalTransition, RunStatus, check_transition

__all__ = [
    "DEFAULT_DEVICE",
    "DeviceArbiter",
    "Lease",
    "device_arbiter",
    "ChunkPlan",
    "ChunkPlanError",
    "plan_chunks",
    "EARLY_STOPPING",
    "ChunkResult",
    "Decisions",
    "EarlyStop",
    "EarlyStoppingPolicy",
    "MedianStopping",
    "NewRun",
    "RunState",
    "SuccessiveHalving",
    "Executor",
    "RunStart",
    "SegmentResult",
    "check_device",
    "device_parts",
    "device_width",
    "overlaps",
    "single_devices",
    "RunSnapshot",
    "Scheduler",
    "SchedulerListener",
    "StopInfo",
    "Decision",
    "Op",
    "OpAck",
    "OpKind",
    "OpKindInfo",
    "OP_KINDS",
    "OpState",
    "PendingOp",
    "expected_status",
    "decide",
    "new_op_id",
    "Assignment",
    "DeviceView",
    "FairPlacement",
    "PlacedRun",
    "FurthestBehindFirst",
    "RunView",
    "SchedulingPolicy",
    "TRANSITIONS",
    "IllegalTransition",
    "RunStatus",
    "check_transition",
]
