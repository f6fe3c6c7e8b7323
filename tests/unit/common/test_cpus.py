"""CPU lists and pinning: lists read and written as Linux does, clear errors, and every thread of
a process pinned (those started before the pin as well as after)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from epd.common.cpus import (
    allowed_cpus,
    check_available,
    format_cpu_list,
    parse_cpu_list,
    pin_threads,
)
from epd.common.server_cli import add_server_arguments, pin_to_cpus


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0", [0]), ("0-3", [0, 1, 2, 3]), ("3,0-1,1", [0, 1, 3]), (" 2 , 4-5", [2, 4, 5])],
)
def test_lists_parse_to_sorted_unique_ids(text: str, cpus: list[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["", "a", "1-", "-1", "3-1", "0,,1", "1.5", "0-99999"])
def test_malformed_lists_are_refused_naming_the_part(text: str) -> None:
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpu_list(text)


def test_formatting_folds_runs_and_reads_back() -> None:
    assert format_cpu_list([8, 0, 1, 2, 3, 10, 11]) == "0-3,8,10-11"
    assert parse_cpu_list(format_cpu_list([5, 1, 2])) == [1, 2, 5]


def test_a_cpu_this_process_may_not_use_is_refused() -> None:
    missing = max(allowed_cpus()) + 1
    with pytest.raises(ValueError, match=f"CPUs {missing} are not available to this process"):
        check_available([missing])


def test_the_cpus_flag_falls_back_to_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPD_CPUS", "0")
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    assert parser.parse_args([]).cpus == "0"
    assert parser.parse_args(["--cpus", "0-1"]).cpus == "0-1"


def test_no_cpus_flag_pins_nothing() -> None:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    assert pin_to_cpus(parser.parse_args(["--cpus", ""])) is None


PINNED_CHILD = textwrap.dedent(
    """
    import argparse, json, os, sys, threading
    from epd.common.server_cli import add_server_arguments, pin_to_cpus
    stop = threading.Event()
    before = threading.Thread(target=stop.wait)
    before.start()
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    cpus = pin_to_cpus(parser.parse_args(sys.argv[1:]))
    after = threading.Thread(target=stop.wait)
    after.start()
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    print(json.dumps({"cpus": cpus, "threads": [sorted(os.sched_getaffinity(t)) for t in tids]}))
    stop.set()
    """
)


def test_pinning_covers_threads_started_before_and_after() -> None:
    allowed = allowed_cpus()
    if len(allowed) < 2:
        pytest.skip("one CPU: pinning to it changes nothing")
    target = allowed[-1]
    done = subprocess.run(
        [sys.executable, "-c", PINNED_CHILD, "--cpus", str(target)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    report = json.loads(done.stdout)
    assert report["cpus"] == [target]
    assert len(report["threads"]) >= 3
    assert all(cpus == [target] for cpus in report["threads"]), report


def test_pin_threads_moves_every_thread_of_another_process() -> None:
    allowed = allowed_cpus()
    if len(allowed) < 2:
        pytest.skip("one CPU: pinning to it changes nothing")
    code = "import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\n"
    child = subprocess.Popen([sys.executable, "-c", code + "time.sleep(30)"])
    try:
        deadline = time.monotonic() + 30
        while len(os.listdir(f"/proc/{child.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pin_threads(child.pid, [allowed[0]]) >= 2
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert all(os.sched_getaffinity(t) == {allowed[0]} for t in tids)
    finally:
        child.kill()
        child.wait()
