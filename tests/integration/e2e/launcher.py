"""Start a topology through ``epd up --keep`` (the same launcher as the scripts) for tests."""

from __future__ import annotations

import ast
import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epd.server.engine.generate_cli import demo_image
from epd.server.engine.reference import ReferenceEngine
from epd.server.transfer import shm

DEMO_TOKENS = re.compile(r"\(tokens (\[[^\]]*\])")


@dataclass
class Stack:
    """A running deployment: endpoints by service name, child pids, run folder; ``work_dir``
    holds the launcher's log (``launcher.log``) and its endpoints file (``endpoints.json``)."""

    endpoints: dict[str, Any]
    launcher: subprocess.Popen[bytes]
    work_dir: Path

    @property
    def route(self) -> str:
        return str(self.endpoints["route"])

    @property
    def run_dir(self) -> Path:
        return Path(self.endpoints["run_dir"])

    @property
    def pids(self) -> dict[str, int]:
        return dict(self.endpoints["pids"])


def epd_command(command: str, model_dir: Path, *args: str) -> list[str]:
    """``epd COMMAND --model MODEL_DIR --model-id tiny ARGS`` in this interpreter."""
    return [
        sys.executable,
        "-m",
        "epd",
        command,
        "--model",
        str(model_dir),
        "--model-id",
        "tiny",
        *args,
    ]


@contextlib.contextmanager
def running_stack(
    model_dir: Path, work_dir: Path, *args: str, timeout_s: float = 480
) -> Iterator[Stack]:
    """``epd up --keep --no-demo ARGS`` until it is ready; SIGTERM and wait on exit."""
    endpoints_file = work_dir / "endpoints.json"
    log = open(work_dir / "launcher.log", "wb")  # noqa: SIM115 - closed below
    launcher = subprocess.Popen(
        epd_command(
            "up",
            model_dir,
            "--keep",
            "--no-demo",
            "--endpoints-file",
            str(endpoints_file),
            "--run-dir",
            str(work_dir / "run"),
            *args,
        ),
        cwd=work_dir,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while not endpoints_file.exists():
            if launcher.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("epd up failed:\n" + (work_dir / "launcher.log").read_text())
            time.sleep(1)
        yield Stack(json.loads(endpoints_file.read_text()), launcher, work_dir)
    finally:
        stop(launcher)
        log.close()


def stop(launcher: subprocess.Popen[bytes]) -> None:
    """SIGTERM to ``epd up``; killed if it has not stopped its deployment within 90 s."""
    launcher.send_signal(signal.SIGTERM)
    try:
        launcher.wait(90)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait()


def assert_demo_answered(output: str, model_dir: Path, question: str, max_tokens: int) -> None:
    """``epd up``'s printed demo answer has the reference engine's tokens for ``question``
    about the demo picture."""
    match = DEMO_TOKENS.search(output)
    assert match, output
    content = [{"type": "image"}, {"type": "text", "text": question}]
    messages = [{"role": "user", "content": content}]
    expected = ReferenceEngine(model_dir).generate(messages, [demo_image()], max_tokens=max_tokens)
    assert ast.literal_eval(match.group(1)) == expected.token_ids


def is_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def session_members(sid: int) -> list[int]:
    """Running (not zombie) processes of session ``sid``."""
    found = subprocess.run(["ps", "-eo", "pid=,sid=,stat="], capture_output=True, text=True)
    members = []
    for line in found.stdout.splitlines():
        pid, session, stat = line.split()[:3]
        if int(session) == sid and not stat.startswith("Z"):
            members.append(int(pid))
    return members


def segments_of(pids: list[int]) -> list[str]:
    """epd shm segments created by any of ``pids`` (by name prefix, whatever their start time)."""
    prefixes = tuple(f"epd-{pid}-" for pid in pids)
    return [name for name in shm.list_segments() if name.startswith(prefixes)]
