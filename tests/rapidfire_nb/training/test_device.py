"""The device thread: functions run on it in order; results and errors come back; inline on it and after close."""

from __future__ import annotations

import threading

import pytest

from rapidfire_nb.training.device import DeviceThread


def test_calls_run_on_the_device_thread_in_order() -> None:
    device = DeviceThread("rapidfire-device-test")
    seen: list[tuple[int, str]] = []
    futures = [
        device.call(lambda i=i: seen.append((i, threading.current_thread().name)) or i) for i in range(5)
    ]
    assert [f.result(5) for f in futures] == [0, 1, 2, 3, 4]
    assert seen == [(i, "rapidfire-device-test") for i in range(5)]
    device.close()


def test_an_error_is_raised_where_the_result_is_asked_and_the_thread_goes_on() -> None:
    device = DeviceThread()

    def boom() -> None:
        raise ValueError("bad config")

    with pytest.raises(ValueError, match="bad config"):
        device.run(boom)
    assert device.run(lambda: 7) == 7
    device.close()


def test_a_call_from_the_device_thread_runs_inline() -> None:
    device = DeviceThread()
    # without inlining, the inner run would wait for the outer call it is part of: a deadlock
    assert device.run(lambda: device.run(lambda: threading.current_thread().name)) == "rapidfire-device"
    device.close()


def test_after_close_calls_run_on_the_calling_thread() -> None:
    device = DeviceThread()
    device.close()
    assert device.run(lambda: threading.current_thread().name) == threading.current_thread().name
