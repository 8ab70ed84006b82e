"""Fixtures for real-kernel tests: an IPython kernel of this venv driven with ``jupyter_client``.

* ``ipy_kernel`` — a :class:`KernelSession`: a kernel started from a throwaway kernelspec whose argv is
  ``[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]`` (so it is this venv's Python,
  whatever kernelspecs the machine has), with its own ``RF_HOME`` (``session.rf_home``), ``IPYTHONDIR`` and
  runtime dir, the repository on ``PYTHONPATH`` and Hugging Face offline. Shut down (and killed if needed)
  after the test.

:class:`KernelSession` keeps every IOPub message it has read, in arrival order, with the monotonic time it was
read (``session.iopub``), so a test can ask afterwards which cell a background thread's output was attached to.
"""

from __future__ import annotations

import json
import os
import queue
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
KERNEL_NAME = "rfnb-test-python"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Received:
    """One IOPub message and the monotonic time the test read it."""

    t: float
    msg: dict[str, Any]

    @property
    def msg_type(self) -> str:
        return str(self.msg["header"]["msg_type"])

    @property
    def parent_id(self) -> str | None:
        return (self.msg.get("parent_header") or {}).get("msg_id")

    @property
    def content(self) -> dict[str, Any]:
        return dict(self.msg.get("content") or {})


@dataclass
class CellResult:
    """What one ``execute_request`` produced (IOPub messages whose parent is this request, until idle)."""

    msg_id: str
    code: str
    sent_at: float
    reply_at: float
    reply: dict[str, Any]
    messages: list[Received] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return self.reply_at - self.sent_at

    @property
    def status(self) -> str:
        return str(self.reply["content"]["status"])

    @property
    def stdout(self) -> str:
        return "".join(m.content.get("text", "") for m in self.messages if m.msg_type == "stream")

    @property
    def text(self) -> str:
        """stdout + stderr + every text/plain result or display, in order."""
        parts = []
        for m in self.messages:
            if m.msg_type == "stream":
                parts.append(m.content.get("text", ""))
            elif m.msg_type in ("execute_result", "display_data"):
                parts.append(str((m.content.get("data") or {}).get("text/plain", "")) + "\n")
            elif m.msg_type == "error":
                parts.append("\n".join(m.content.get("traceback") or []) + "\n")
        return _ANSI.sub("", "".join(parts))

    def data(self, mime: str) -> list[Any]:
        return [
            (m.content.get("data") or {})[mime]
            for m in self.messages
            if m.msg_type in ("execute_result", "display_data") and mime in (m.content.get("data") or {})
        ]


class KernelSession:
    """A started kernel plus a blocking client; every IOPub message read is kept in ``self.iopub``."""

    def __init__(self, km: Any, kc: Any, rf_home: Path) -> None:
        self.km = km
        self.kc = kc
        self.rf_home = rf_home
        self.iopub: list[Received] = []

    # -- IOPub -------------------------------------------------------------------------------------------
    def drain(self, timeout: float = 0.0) -> list[Received]:
        """Read every IOPub message available (waiting up to ``timeout`` s for the first one)."""
        new: list[Received] = []
        wait = timeout
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=wait)
            except queue.Empty:
                break
            rec = Received(time.monotonic(), msg)
            self.iopub.append(rec)
            new.append(rec)
            wait = 0.0
        return new

    def wait_for(self, predicate: Callable[[Received], bool], timeout: float, what: str) -> Received:
        """Read IOPub until a message (new or already read) satisfies ``predicate``."""
        for rec in self.iopub:
            if predicate(rec):
                return rec
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in self.drain(timeout=min(0.5, max(0.0, deadline - time.monotonic()))):
                if predicate(rec):
                    return rec
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last messages:\n{self.tail()}")

    def tail(self, n: int = 15) -> str:
        rows = []
        for rec in self.iopub[-n:]:
            c = rec.content
            brief = c.get("text") or c.get("execution_state") or c.get("data") or c
            rows.append(f"{rec.msg_type}: {json.dumps(brief, default=str)[:300]}")
        return "\n".join(rows)

    # -- shell -------------------------------------------------------------------------------------------
    def execute(self, code: str, timeout: float = 60.0, allow_error: bool = False) -> CellResult:
        """Run ``code`` as a cell; return once its reply and its ``idle`` status arrived."""
        sent = time.monotonic()
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        deadline = sent + timeout
        reply = None
        while reply is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no execute_reply within {timeout}s for:\n{code}\n{self.tail()}")
            try:
                msg = self.kc.get_shell_msg(timeout=min(remaining, 1.0))
            except queue.Empty:
                self.drain()
                continue
            if (msg.get("parent_header") or {}).get("msg_id") == msg_id:
                reply = msg
        reply_at = time.monotonic()
        self.wait_for(
            lambda r: (
                r.parent_id == msg_id
                and r.msg_type == "status"
                and r.content.get("execution_state") == "idle"
            ),
            max(5.0, deadline - time.monotonic()),
            f"the idle status of the cell:\n{code}",
        )
        result = CellResult(
            msg_id, code, sent, reply_at, reply, [r for r in self.iopub if r.parent_id == msg_id]
        )
        if result.status != "ok" and not allow_error:
            raise AssertionError(f"cell failed:\n{code}\n{result.text}")
        return result

    def messages_of(self, msg_id: str) -> list[Received]:
        return [r for r in self.iopub if r.parent_id == msg_id]

    # -- comms -------------------------------------------------------------------------------------------
    def send_custom(self, comm_id: str, content: dict[str, Any]) -> None:
        """What a widget front end sends for ``model.send(content)``: a ``comm_msg`` with the custom envelope."""
        msg = self.kc.session.msg(
            "comm_msg", {"comm_id": comm_id, "data": {"method": "custom", "content": content}}
        )
        self.kc.shell_channel.send(msg)


@pytest.fixture()
def ipy_kernel(tmp_path: Path) -> Iterator[KernelSession]:
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec_dir = tmp_path / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "rapidfire_nb test (venv python)",
                "language": "python",
            }
        )
    )
    rf_home = tmp_path / "rf_home"
    for d in ("rf_home", "ipython", "runtime", "cwd"):
        (tmp_path / d).mkdir(exist_ok=True)
    env = dict(os.environ)
    env.update(
        {
            "RF_HOME": str(rf_home),
            "IPYTHONDIR": str(tmp_path / "ipython"),
            "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("JPY_PARENT_PID", None)  # no Jupyter server behind this kernel
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    km = KernelManager(
        kernel_name=KERNEL_NAME,
        kernel_spec_manager=ksm,
        connection_file=str(tmp_path / "runtime" / "kernel-test.json"),
    )
    km.start_kernel(env=env, cwd=str(tmp_path / "cwd"))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        yield KernelSession(km, kc, rf_home)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False, restart=False)
        if km.is_alive():  # pragma: no cover - shutdown_kernel kills after its own timeout
            km.shutdown_kernel(now=True)
