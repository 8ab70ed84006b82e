"""An op request's body and fields, checked without a server (rapidfire_nb.server.checks)."""

from __future__ import annotations

import pytest

from rapidfire_nb.server.checks import (
    MAX_BODY_BYTES,
    MAX_JSON_DEPTH,
    ApiError,
    check_change,
    parse_op,
    parse_op_body,
)


@pytest.mark.parametrize(
    ("raw", "status", "fragment"),
    [
        (b"x" * (MAX_BODY_BYTES + 1), 413, f"at most {MAX_BODY_BYTES} bytes"),
        (b'{"kind": "\xff"}', 400, "not valid JSON"),
        (b"[" * 5000 + b"]" * 5000, 400, f"more than {MAX_JSON_DEPTH} levels"),
        (b'{"kind": "stop", "run_id": NaN}', 400, "NaN is not valid JSON"),
        (b'{"kind": ', 400, "not valid JSON"),
    ],
)
def test_a_bad_body_is_refused_with_its_status(raw: bytes, status: int, fragment: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_op_body(raw)
    assert info.value.status == status and fragment in info.value.message


def test_a_good_body_parses_into_its_fields() -> None:
    body = parse_op_body(
        b'{"op_id": "a1", "kind": "clone", "run_id": 2, "changes": {"lr": 0.5}, "warm_start": true}'
    )
    assert parse_op(body) == ("a1", "clone", 2, {"lr": 0.5}, True)
    assert parse_op({"op_id": "b", "kind": "stop", "run_id": 3}) == ("b", "stop", 3, {}, False)


def test_only_a_kind_that_takes_changes_gets_them() -> None:
    with pytest.raises(ApiError, match=r"a stop op takes no changes and no warm_start \(only clone does\)"):
        parse_op({"kind": "stop", "run_id": 1, "warm_start": True})


def test_a_change_is_checked_against_the_stored_type() -> None:
    check_change("learning_rate", 0.1, {"learning_rate": "float"}, 1)
    with pytest.raises(ApiError, match="learning_rate must be a number"):
        check_change("learning_rate", "fast", {"learning_rate": "float"}, 1)
    with pytest.raises(ApiError, match=r"seed is not an editable field of run 4 \(editable: learning_rate\)"):
        check_change("seed", 1, {"learning_rate": "float"}, 4)
