"""The report of ``overhead.py``: one block per case, the targets with OK/MISSED, and the block to paste.

Input per case: its settings, and per repeat one child result per *side* (see :data:`SIDES`). Every ratio is a
median over repeats of per-repeat ratios (both children of a ratio come from the same repeat).
"""

from __future__ import annotations

import statistics
from typing import Any

#: the children of one repeat: label -> (rapidfire_nb?, passive?); "users' setting" is the environment as users
#: have it (by default OMP_WAIT_POLICY unset), "passive" sets OMP_WAIT_POLICY=PASSIVE
SIDES = {
    "seq": (False, False),
    "seqP": (False, True),
    "rf": (True, False),
    "rf1": (True, False),
    "rfP": (True, True),
    "rfN": (True, False),
    "rfG": (True, False),
}
PASSIVE = "OMP_WAIT_POLICY=passive"
TARGET_SWITCH_SHARE = 0.02  # chunk-switch time / training time (the earlier issue's target)
TARGET_SWITCH_MS = 5.0  # our own time per chunk switch, on the tiny model (issue 18)


def med(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def fmt(x: float | None, spec: str = ".3f") -> str:
    """``format(x, spec)``; None reads ``n/a`` (as wide as the spec asks)."""
    if x is None:
        width = spec.split(".")[0]
        return format("n/a", f">{width}") if width.isdigit() else "n/a"
    return format(x, spec)


def ok(value: float | None, limit: float) -> str:
    return "OK" if value is not None and value <= limit else "MISSED"


def loss_diff(rf: dict[str, Any], base: dict[str, Any]) -> float | None:
    """Max |loss_rf - loss_base| over every logged (run, step): a check that both sides did the same work."""
    worst, found = 0.0, False
    for run, curve in base["losses"].items():
        other = rf["losses"].get(run, {})
        for step, v in curve.items():
            w = other.get(str(step), other.get(int(step)) if str(step).isdigit() else None)
            if w is not None:
                worst, found = max(worst, abs(float(w) - float(v))), True
    return worst if found else None


def reference(reps: list[dict[str, Any]]) -> str:
    """The faster of sequential's settings (lower median total): ``"seq"`` or ``"seqP"``."""
    times = {s: med([r[s]["total_s"] for r in reps if s in r]) for s in ("seq", "seqP")}
    have = {s: t for s, t in times.items() if t is not None}
    return min(have, key=lambda s: have[s])


def per_switch(rf: dict[str, Any]) -> tuple[float | None, float, float, float, int]:
    """Our own fixed cost per chunk switch of one rf child: ``(ms or None, hand-off s, saves s, boundary s, n)``.

    (hand-off - final saves made inside hand-offs + boundary work) / hand-offs. The hand-off already holds the
    next run's RNG restore and adapter activation; the boundary work is the snapshot and handing it to the
    checkpoint writer (the write itself is a background thread's).
    """
    n = int(rf.get("handoffs") or 0)
    hand = float(rf.get("handoff_s") or 0.0)
    saves = float(rf.get("saves_in_handoffs_s") or 0.0)
    boundary = sum(v for k, v in rf.get("costs", {}).items() if k.startswith("boundary (snapshot"))
    ms = (hand - saves + boundary) / n * 1000 if n else None
    return ms, hand, saves, boundary, n


def _row(name: str, value: str, per: list[str], note: str = "") -> str:
    return f"    {name:<68} {value:>8}   {', '.join(per):<34} {note}".rstrip()


def _totals(c: dict[str, Any], reps: list[dict[str, Any]], sides: list[str]) -> list[str]:
    lines = [f"  total time (s){'':<57}median   per repeat"]
    for s in sides:
        vals = [r[s]["total_s"] if s in r else None for r in reps]
        lines.append(_row(_side_name(c, s), fmt(med(vals), ".2f"), [fmt(v, ".2f") for v in vals]))
    return lines


def _side_name(c: dict[str, Any], side: str) -> str:
    chunk, user = c["steps"] // c["num_chunks"], c["user_omp"]
    return {
        "seq": f"sequential plain TRL, {user}",
        "seqP": f"sequential plain TRL, {PASSIVE}",
        "rf": f"rapidfire_nb, {_per_chunk(chunk)}, {user}",
        "rf1": f"rapidfire_nb, {_per_chunk(c['steps'])} (num_chunks=1), {user}",
        "rfP": f"rapidfire_nb, {_per_chunk(chunk)}, {PASSIVE}",
        "rfN": f"rapidfire_nb, {_per_chunk(chunk)}, after torch on the main thread",
        "rfG": f"rapidfire_nb, {_per_chunk(chunk)}, TRL's gc.collect() at every train() start",
    }[side]


def _per_chunk(steps: int) -> str:
    return f"{steps} step{'s' if steps != 1 else ''}/chunk"


def _setting(c: dict[str, Any], side: str) -> str:
    return PASSIVE if SIDES[side][1] else c["user_omp"]


def _only(reps: list[dict[str, Any]], ref: str) -> str:
    """``"; over the 1 of 5 repeats that ran it"`` when the reference side ran in fewer repeats (``--passive-repeats``)."""
    n = sum(1 for r in reps if ref in r)
    return f"; over the {n} of {len(reps)} repeats that ran it" if n < len(reps) else ""


def _ratios(c: dict[str, Any], reps: list[dict[str, Any]], sides: list[str], targets: list) -> list[str]:
    ref = reference(reps)
    ref_t = med([r[ref]["total_s"] for r in reps if ref in r])
    lines = [
        (
            f"  ratio to sequential ({_setting(c, ref)}: {fmt(ref_t, '.2f')} s)"
            if c.get("pinned")
            else f"  ratio to sequential's faster setting ({_setting(c, ref)}: {fmt(ref_t, '.2f')} s{_only(reps, ref)})"
        )
    ]
    notes = {
        "rf": None,
        "rf1": "(no-switching reference)",
        "rfP": "(passive, beside it)",
        "rfN": "(a notebook, beside it)",
        "rfG": "(like for like, beside it)",
    }
    for s in (x for x in ("rf", "rf1", "rfP", "rfN", "rfG") if x in sides):
        vals = [r[s]["total_s"] / r[ref]["total_s"] for r in reps if s in r and ref in r]
        m = med(vals)
        note = notes[s] or f"<= {c['target']:.2f}x  {ok(m, c['target'])}"
        limit = c["target"] if s == "rf" else None
        what = {
            "rf": "total time rf / sequential, pinned pairs"
            if c.get("pinned")
            else f"total time rf / sequential (faster: {_setting(c, ref)})",
            "rf1": "  beside it: the same, num_chunks=1 (no switching)",
            "rfP": f"  beside it: the same, rf with {PASSIVE}",
            "rfN": "  beside it: the same, after a torch op on the main thread (a notebook)",
            "rfG": "  beside it: the same, TRL's full gc.collect() at every run's train() start",
        }[s]
        targets.append((f"{c['label']}: {what}", f"{fmt(m)}x", limit, m))
        lines.append(_row(_side_name(c, s), fmt(m), [fmt(v) for v in vals], note))
    if "rfP" in sides and "seqP" in sides:
        vals = [r["rfP"]["total_s"] / r["seqP"]["total_s"] for r in reps if "rfP" in r and "seqP" in r]
        lines.append(
            _row("rapidfire_nb passive / sequential passive", fmt(med(vals)), [fmt(v) for v in vals])
        )
    if "seqP" in sides and "seq" in sides:
        vals = [r["seqP"]["total_s"] / r["seq"]["total_s"] for r in reps if "seqP" in r and "seq" in r]
        lines.append(
            _row("(sequential passive / sequential users' setting)", fmt(med(vals)), [fmt(v) for v in vals])
        )
    return lines


def _details(c: dict[str, Any], reps: list[dict[str, Any]]) -> list[str]:
    """rf (users' setting) against the faster sequential setting: evals, switch share, memory, phases."""
    ref = reference(reps)
    pairs = [(r["rf"], r[ref]) for r in reps if ref in r]
    fe = [
        rf["first_eval_all_s"] / b["first_eval_all_s"]
        for rf, b in pairs
        if rf.get("first_eval_all_s") and b.get("first_eval_all_s")
    ]
    sw = [rf["switch_s"] / rf["train_s"] for rf, _ in pairs]
    lines = [
        f"  rapidfire_nb ({c['user_omp']}) against sequential plain TRL ({_setting(c, ref)}{_only(reps, ref)}):"
    ]
    lines.append(
        _row(
            "time until every config has an eval (ratio)",
            fmt(med(fe)),
            [fmt(x) for x in fe],
            "(lower is better)",
        )
    )
    lines.append(
        _row(
            "chunk-switch time / rf training time",
            fmt(med(sw), ".2%"),
            [fmt(x, ".2%") for x in sw],
            f"<= {TARGET_SWITCH_SHARE:.0%}  {ok(med(sw), TARGET_SWITCH_SHARE)}",
        )
    )
    for what, key in (
        ("peak RSS ratio", "peak_rss_mb"),
        ("training-phase time ratio (train() only)", "train_s"),
    ):
        vals = [rf[key] / b[key] for rf, b in pairs]
        lines.append(_row(what, fmt(med(vals)), [fmt(x) for x in vals]))
    cpu = [rf["cpu_s"] / b["cpu_s"] for rf, b in pairs if rf.get("cpu_s") and b.get("cpu_s")]
    if cpu:  # results from before 2026-12-03 have no CPU times
        lines.append(
            _row(
                "CPU-time ratio (user+sys, whole child; stolen time not in it)",
                fmt(med(cpu)),
                [fmt(x) for x in cpu],
            )
        )
    lines.append(f"  absolute medians (s){_only(reps, ref)}:")
    for key, what in (
        ("total_s", "total"),
        ("setup_s", "setup (model load + trainer builds)"),
        ("train_s", "training phase"),
        ("first_eval_all_s", "every config has an eval"),
    ):
        rf_v, b_v = med([rf.get(key) for rf, _ in pairs]), med([b.get(key) for _, b in pairs])
        lines.append(f"    {what:<42} rf {fmt(rf_v, '8.2f')}   sequential {fmt(b_v, '8.2f')}")
    if any(rf.get("cpu_s") for rf, _ in pairs):
        for key, what in (
            ("cpu_s", "CPU time, whole child (user+sys)"),
            ("stolen_s", "stolen by the VM host (all CPUs)"),
        ):
            rf_v, b_v = med([rf.get(key) for rf, _ in pairs]), med([b.get(key) for _, b in pairs])
            lines.append(f"    {what:<42} rf {fmt(rf_v, '8.2f')}   sequential {fmt(b_v, '8.2f')}")
    k = c["num_chunks"]
    lines.append(
        f"    {'rf chunk switches + snapshots':<42} rf {fmt(med([rf['switch_s'] for rf, _ in pairs]), '8.3f')}"
        f"   ({(k - 1) * 4} boundaries + {k * 4} activations)"
    )
    lines.append(
        f"    {'rf experiment.end()':<42} rf {fmt(med([rf['end_s'] for rf, _ in pairs]), '8.2f')}   "
        f"sequential save_model {fmt(med([b['save_s'] for _, b in pairs]), '8.2f')}"
    )
    lines.append(
        f"    {'peak RSS (MB)':<42} rf {fmt(med([rf['peak_rss_mb'] for rf, _ in pairs]), '8.0f')}   "
        f"sequential {fmt(med([b['peak_rss_mb'] for _, b in pairs]), '8.0f')}"
    )
    return lines


ROLE_NAMES = {
    "recorder": "recorder thread",
    "checkpoints": "checkpoint writer thread",
    "scheduler": "scheduler thread",
    "trackers": "trackers thread",
    "other": "main thread: setup, end",
}


def _cost(rfs: list[dict[str, Any]], key: str) -> tuple[float | None, int]:
    return med([rf.get("costs", {}).get(key) for rf in rfs]), int(rfs[0].get("cost_calls", {}).get(key, 0))


def _cost_line(name: str, value: float | None, calls: int | None, indent: int = 6, each: bool = False) -> str:
    per = f"  ({value / calls * 1e6:.0f} us each)" if each and value is not None and calls else ""
    count = f"  x{calls}" if calls is not None else ""
    return f"{' ' * indent}{name:<{76 - indent}} {fmt(value, '8.3f')}{count}{per}"


def _costs(c: dict[str, Any], reps: list[dict[str, Any]], targets: list) -> list[str]:
    """Where rapidfire_nb's own time goes (rf child, users' setting), by thread, and the cost per switch."""
    rfs = [r["rf"] for r in reps]
    keys = sorted({k for rf in rfs for k in rf.get("costs", {})})
    lines = [f"  where rapidfire_nb's own time goes (rf child, {c['user_omp']}; medians; s, calls):"]
    lines.append("    on the device thread (every run trains here: the critical path)")
    hand, n = med([rf.get("handoff_s") for rf in rfs]), int(rfs[0].get("handoffs") or 0)
    lines.append(
        _cost_line("hand-off (a run parks -> the next trains; its RNG restore + activation)", hand, n)
    )
    act, n_act = _cost(rfs, "adapter activation|device")
    lines.append(_cost_line("of it: adapter activation (set_adapter + check)", act, n_act, indent=8))
    saves = med([rf.get("saves_in_handoffs_s") for rf in rfs])
    n_saves = rfs[0].get("saves_in_handoffs")
    lines.append(
        _cost_line("of it: final saves of finished runs (not in the cost per switch)", saves, n_saves, 8)
    )
    for label, each in (
        ("boundary (snapshot + checkpoint hand-over)", False),
        ("boundary snapshot (Snapshotter.take)", False),
        ("per-step metrics into the recorder's queue", True),
        ("final save (save_pretrained)", False),
    ):
        key = f"{label}|device"
        if key in keys:
            v, calls = _cost(rfs, key)
            lines.append(
                _cost_line(
                    ("of it: " if "take" in label else "") + label,
                    v,
                    calls,
                    8 if "take" in label else 6,
                    each,
                )
            )
    lines.append(
        "    on background threads (lowered priority; they share the CPUs but nothing waits for them)"
    )
    lines.append(
        _cost_line(
            "recorder: everything it wrote (write_seconds)",
            med([rf.get("recorder_write_s") for rf in rfs]),
            None,
        )
    )
    for key in keys:
        label, role = key.rsplit("|", 1)
        if role != "device" and not label.startswith("recorder batches"):
            v, calls = _cost(rfs, key)
            lines.append(_cost_line(f"{label} ({ROLE_NAMES.get(role, role)})", v, calls))
    return lines + _switch_cost(c, reps, targets)


def _switch_cost(c: dict[str, Any], reps: list[dict[str, Any]], targets: list) -> list[str]:
    lines = []
    for side in (s for s in ("rf", "rf1") if s in reps[0]):
        got = [per_switch(r[side]) for r in reps]
        ms = med([g[0] for g in got])
        _, hand, saves, boundary, n = got[0]
        label = (
            "our own fixed cost per chunk switch"
            if side == "rf"
            else "the same without chunks (num_chunks=1)"
        )
        line = (
            f"  {label}: (hand-off - final saves + boundary) / switches = {fmt(ms, '.2f')} ms"
            f"  (per repeat {', '.join(fmt(g[0], '.2f') for g in got)}; {n} switches)"
        )
        if side == "rf" and c.get("switch_target"):
            line += f"  <= {TARGET_SWITCH_MS:.0f} ms  {ok(ms, TARGET_SWITCH_MS)}"
            targets.append(
                (f"{c['label']}: own time per chunk switch", f"{fmt(ms, '.2f')} ms", TARGET_SWITCH_MS, ms)
            )
        lines.append(line)
    return lines


def _same_work(
    c: dict[str, Any], reps: list[dict[str, Any]], one: dict[str, Any] | None, targets: list
) -> list[str]:
    lines = []
    if one is not None:
        n_peak = med([r["rf"]["peak_rss_mb"] for r in reps])
        assert n_peak is not None
        lines.append(
            f"  memory of N runs vs one run (rapidfire_nb, peak RSS): 4 runs {n_peak:.0f} MB / 1 run "
            f"{one['peak_rss_mb']:.0f} MB = {n_peak / one['peak_rss_mb']:.2f}x "
            f"(+{n_peak - one['peak_rss_mb']:.0f} MB for 3 more runs)"
        )
    diffs = [loss_diff(r[a], r[b]) for r in reps for a in r if SIDES[a][0] for b in r if not SIDES[b][0]]
    md = max((d for d in diffs if d is not None), default=None)
    ok_same = "OK" if md == 0.0 else "MISSED"
    lines.append(
        f"  same work check: max |train loss rf - sequential| over all runs, steps and settings = "
        f"{fmt(md, '.2e')}  = 0.0  {ok_same}"
    )
    targets.append((f"{c['label']}: same work, max |loss rf - sequential|", fmt(md, ".1e"), 0.0, md))
    # each side against itself, child against child: plain TRL is not always the same from one process to the next
    # (SmolLM2, 2026-12-04: 1 of 5 sequential children differed in one run from its 3rd step on, by up to 2.1e-4)
    own = []
    for side in sorted({a for r in reps for a in r}):
        runs = [r[side] for r in reps if side in r]
        worst = [loss_diff(x, y) for i, x in enumerate(runs) for y in runs[i + 1 :]]
        got = [d for d in worst if d is not None]
        if got:
            own.append(f"{side} {fmt(max(got), '.2e')} ({len(runs)} children)")
    if own:
        lines.append("  each side against itself, child against child (max |loss diff|): " + ", ".join(own))
    return lines


def report_case(
    c: dict[str, Any],
    reps: list[dict[str, Any]],
    orders: list[str],
    one: dict[str, Any] | None,
    targets: list,
    control: list[dict[str, Any]] | None = None,
) -> list[str]:
    """The report block of one case; appends ``(name, value text, limit, value)`` of its targets to ``targets``.

    ``control``: ``--pinned-pairs``' sequential-against-sequential pairs, ``{"cpus": [a, b], "totals": [s, s]}``.
    """
    sides = [s for s in SIDES if s in reps[0]]
    chunk = c["steps"] // c["num_chunks"]
    evals = "eval at every chunk end on both sides" if c["eval"] else "no eval set"
    title = (
        f"== {c['label']}: {c['title']}; 4 SFT LoRA configs x {c['steps']} steps, batch {c['batch']}, "
        f"{c['steps'] * c['batch']} rows, {evals}; {_per_chunk(chunk)} (num_chunks={c['num_chunks']}); "
        f"{len(reps)} repeat(s), {'start orders (first listed started first)' if c.get('pinned') else 'orders'} "
        f"{', '.join(orders)} =="
    )
    lines = [title]
    lines += _totals(c, reps, sides)
    lines += _ratios(c, reps, sides, targets)
    lines += _details(c, reps)
    lines += _costs(c, reps, targets)
    lines += _same_work(c, reps, one, targets)
    lines += _control(control, targets, c["label"])
    return lines


def _control(control: list[dict[str, Any]] | None, targets: list, label: str) -> list[str]:
    """The precision of ``--pinned-pairs`` on this machine: the same sequential work on both CPUs at once."""
    if not control:
        return []
    ratios = [p["totals"][0] / p["totals"][1] for p in control]
    per = ", ".join(f"{r:.3f} (cpu{p['cpus'][0]}/cpu{p['cpus'][1]})" for r, p in zip(ratios, control))
    spread = max(abs(r - 1.0) for r in ratios)
    targets.append(
        (
            f"{label}: control, sequential / sequential at once (largest |1 - ratio|)",
            f"{spread:.3f}",
            None,
            spread,
        )
    )
    return [
        f"  control (the layout's own precision): sequential against sequential at the same time, {len(control)} "
        f"pair(s), first started / second: {per}; largest |1 - ratio| {spread:.3f}"
    ]


def summary(targets: list[tuple[str, str, float | None, float | None]]) -> list[str]:
    """The targets of every case, one line each, with OK/MISSED (a limit of None: a reading shown beside)."""
    lines = ["targets (issue 18; users' OMP setting, against sequential's faster setting):"]
    for name, text, limit, value in targets:
        if limit is None:  # shown beside a target, none of its own
            lines.append(f"  {name:<72} {text:>10}")
            continue
        verdict = ("OK" if value == 0.0 else "MISSED") if limit == 0.0 else ok(value, limit)
        shown = "= 0.0" if limit == 0.0 else (f"<= {limit:.0f} ms" if "ms" in text else f"<= {limit:.2f}x")
        lines.append(f"  {name:<72} {text:>10}   {shown:<9} {verdict}")
    return lines
