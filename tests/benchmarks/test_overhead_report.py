"""benchmarks/overhead_report.py on recorded runs: SmolLM2's 5 repeats with the passive side in the first only, and
SmolLM2's pinned pairs (``--pinned-pairs``) with their control pairs.

The recordings are copies of 2026-12-03's ``benchmarks/results/smollm2_latest.json`` and ``smollm2_pinned.json``
in ``tests/benchmarks/data/``, so that a new benchmark run (which rewrites the results) does not change the tests."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(BENCH))

import overhead_report  # noqa: E402


def _recorded() -> tuple[dict, list[dict], list[str]]:
    raw = json.loads((DATA / "smollm2_5_repeats_2026-12-03.json").read_text())
    got = raw["cases"]["smollm2"]
    return got["case"], got["repeats"], got["orders"]


def _line(lines: list[str], start: str) -> str:
    return next(line for line in lines if line.strip().startswith(start))


def test_passive_side_in_the_first_repeat_only_reads_n_a_after_it() -> None:
    c, reps, orders = _recorded()
    assert [("seqP" in r) for r in reps] == [True, False, False, False, False]
    targets: list = []
    lines = overhead_report.report_case(c, reps, orders, None, targets)
    passive = _line(lines, "sequential plain TRL, OMP_WAIT_POLICY=passive")
    assert passive.split()[-5:] == ["192.38,", "n/a,", "n/a,", "n/a,", "n/a"]
    # the ratio is over all 5 pairs, against sequential's faster setting (the users' one: 109.94 s median)
    rf_rows = [
        line
        for line in lines
        if line.strip().startswith("rapidfire_nb, 8 steps/chunk, OMP_WAIT_POLICY unset")
    ]
    ratio = rf_rows[1]  # the first is its total time
    assert "1.062   1.237, 0.988, 1.062, 1.257, 0.994" in ratio and ratio.endswith("<= 1.02x  MISSED")
    name, text, limit, value = next(t for t in targets if t[0].startswith("smollm2: total time"))
    assert (text, limit) == ("1.062x", 1.02) and abs(value - 1.0624) < 1e-3
    # sequential passive / sequential users' setting: only the repeat that has both
    assert _line(lines, "(sequential passive / sequential users' setting)").split()[-2:] == ["2.034", "2.034"]


def test_cpu_lines_only_when_the_children_recorded_them() -> None:
    c, reps, orders = _recorded()
    assert not any(
        "CPU-time ratio" in line for line in overhead_report.report_case(c, reps, orders, None, [])
    )
    for i, r in enumerate(reps):
        r["rf"]["cpu_s"], r["seq"]["cpu_s"] = 200.0 + i, 100.0 + i
        r["rf"]["stolen_s"], r["seq"]["stolen_s"] = 0.5, 1.5
    lines = overhead_report.report_case(c, reps, orders, None, [])
    cpu = _line(lines, "CPU-time ratio")
    assert f"{202 / 102:.3f}   {200 / 100:.3f}," in cpu  # the median of 200/100 ... 204/104 is 202/102
    assert _line(lines, "stolen by the VM host").split()[-3:] == ["0.50", "sequential", "1.50"]


def test_a_reference_from_fewer_repeats_says_so() -> None:
    c, reps, orders = _recorded()
    assert not any(
        "repeats that ran it" in line for line in overhead_report.report_case(c, reps, orders, None, [])
    )
    reps[0]["seqP"]["total_s"] = 50.0  # the passive side, run in repeat 1 only, is now the faster setting
    lines = overhead_report.report_case(c, reps, orders, None, [])
    assert "(OMP_WAIT_POLICY=passive: 50.00 s; over the 1 of 5 repeats that ran it)" in _line(
        lines, "ratio to"
    )
    assert (
        _line(lines, "absolute medians (s)") == "  absolute medians (s); over the 1 of 5 repeats that ran it:"
    )


def _pinned() -> dict:
    raw = json.loads((DATA / "smollm2_pinned_2026-12-03.json").read_text())
    return raw["cases"]["smollm2-pinned"]


def test_pinned_pairs_report_their_pairs_and_the_control() -> None:
    got = _pinned()
    c, reps, control = got["case"], got["repeats"], got["control"]
    assert c["pinned"] and len(control) == 2 and all(r["rf"]["torch_threads"] == 1 for r in reps)
    targets: list = []
    lines = overhead_report.report_case(c, reps, got["orders"], None, targets, control)
    ratios = [r["rf"]["total_s"] / r["seq"]["total_s"] for r in reps]
    row = _line(lines, "rapidfire_nb, 8 steps/chunk, 1 thread on its own CPU, at the same time    ")
    assert f"{statistics.median(ratios):.3f}   {', '.join(f'{x:.3f}' for x in ratios)}" in row
    ctl = [p["totals"][0] / p["totals"][1] for p in control]
    line = _line(lines, "control (the layout's own precision)")
    assert f"{ctl[0]:.3f} (cpu{control[0]['cpus'][0]}/cpu{control[0]['cpus'][1]})" in line
    assert line.endswith(f"largest |1 - ratio| {max(abs(1 - x) for x in ctl):.3f}")
    name, text, limit, value = targets[-1]
    assert name.startswith("smollm2-pinned: control") and limit is None  # a reading, not a target
    # the start order alternates every two pairs, the CPUs every pair
    firsts = [o.split("|")[0].split("@")[0] for o in got["orders"]]
    assert firsts[:4] == ["rf", "rf", "seq", "seq"]


def test_control_repeats_only_with_pinned_pairs() -> None:
    import overhead

    a = overhead._parser().parse_args(["--cases", "tiny", "--control-repeats", "2"])
    with pytest.raises(SystemExit, match="only with --pinned-pairs"):
        overhead._cases(a)
    a = overhead._parser().parse_args(["--cases", "tiny", "--pinned-pairs", "--control-repeats", "2"])
    (c,) = overhead._cases(a)
    assert c["label"] == "tiny-pinned" and c["pinned"]


def _report_from(path: Path, *extra: str) -> None:
    import overhead

    overhead.report_from(overhead._parser().parse_args(["--report-from", str(path), *extra]))


def test_report_from_refuses_what_it_cannot_read_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "report.txt").write_text("rapidfire_nb overhead benchmark\n")
    (tmp_path / "odd.json").write_text(json.dumps({"cases": {"x": 5}, "head": [], "tail": []}))
    for name, says in (
        ("missing.json", "cannot read"),
        ("report.txt", "is not the .json of an overhead.py run"),
        ("odd.json", "is not the .json of an overhead.py run"),
    ):
        with pytest.raises(SystemExit) as got:
            _report_from(tmp_path / name)
        assert says in str(got.value) and "\n" not in str(got.value)


def test_report_from_prints_only_unless_given_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "pinned.json"
    src.write_text((DATA / "smollm2_pinned_2026-12-03.json").read_text())
    _report_from(src)
    assert "smollm2-pinned: total time rf / sequential, pinned pairs" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pinned.json"]  # nothing written
    _report_from(src, "--out", str(tmp_path / "pinned.txt"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pinned.json", "pinned.md", "pinned.txt"]


def test_each_side_is_compared_with_itself_child_against_child() -> None:
    c, reps, orders = _recorded()
    line = _line(overhead_report.report_case(c, reps, orders, None, []), "each side against itself")
    assert "rf 0.00e+00 (5 children)" in line and "seq 0.00e+00 (5 children)" in line
    assert "seqP" not in line  # one child: nothing to compare
    curve = reps[1]["seq"]["losses"]["1"]
    step = sorted(curve, key=int)[2]
    curve[step] = float(curve[step]) + 2.5e-4  # one sequential child differs from the others
    targets: list = []
    lines = overhead_report.report_case(c, reps, orders, None, targets)
    assert "seq 2.50e-04 (5 children)" in _line(lines, "each side against itself")
    assert "rf 0.00e+00 (5 children)" in _line(lines, "each side against itself")
    name, text, limit, value = next(t for t in targets if "same work" in t[0])
    assert value == pytest.approx(2.5e-4) and limit == 0.0
