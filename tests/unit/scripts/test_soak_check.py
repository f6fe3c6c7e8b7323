"""The pure logic of ``scripts/bench_soak.py``: the kill schedule, the check of a stream against
its reference (a piece missing or repeated is corruption), the latency of the requests a kill moved,
memory trends, and which new /dev/shm names are this deployment's."""

from __future__ import annotations

import math
import signal

import pytest

from tests.unit.scripts.loader import load

check = load("soak_check")
REFERENCE = ["The", " cat", " sat", " on", " the", " mat"]


@pytest.mark.parametrize(
    ("text", "role", "after", "signum"),
    [
        ("encoder@100", "encoder", 100, signal.SIGKILL),
        ("prefill@0:TERM", "prefill", 0, signal.SIGTERM),
        ("decode@7:SIGKILL", "decode", 7, signal.SIGKILL),
        ("scheduler@3:term", "scheduler", 3, signal.SIGTERM),
    ],
)
def test_kill_is_parsed(text: str, role: str, after: int, signum: int) -> None:
    assert check.parse_kill(text) == check.Kill(role, after, signum)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("gpu@1", "ROLE one of"),
        ("encoder", "ROLE one of"),
        ("encoder@soon", "request number"),
        ("encoder@-1", "request number"),
        ("encoder@5:HUP", "signal 'HUP'"),
    ],
)
def test_a_bad_kill_is_refused_with_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        check.parse_kill(text)


def test_chaos_kills_each_role_with_each_signal_once_spread_inside_the_run() -> None:
    kills = check.chaos_schedule(1000)
    assert [(k.role, k.signum) for k in kills] == [
        (role, signum)
        for signum in (signal.SIGKILL, signal.SIGTERM)
        for role in ("encoder", "prefill", "decode", "scheduler")
    ]
    moments = [k.after_requests for k in kills]
    assert moments == sorted(set(moments))
    assert moments[0] >= 100 and moments[-1] < 900


def test_the_same_text_cut_otherwise_is_ok() -> None:
    assert check.check_stream(REFERENCE, ["The cat", " sat on", " the mat"]).is_ok


@pytest.mark.parametrize(
    ("pieces", "kind", "at"),
    [
        (["The", " cat", " on", " the", " mat"], "missing", 2),
        (["The", " cat", " sat", " on", " the"], "missing", 5),
        (["The", " cat", " sat", " sat", " on", " the", " mat"], "repeated", 2),
        (["The", " cat", " sat", " on", " the", " mat", " mat"], "repeated", 6),
        (["The", " cat", " sat", " under", " the", " mat"], "changed", 3),
        (["The", " cat", " sat", " on", " the", " mat", " again"], "changed", 6),
        ([], "missing", 0),
    ],
)
def test_a_stream_with_a_missing_or_repeated_piece_is_corrupted(
    pieces: list[str], kind: str, at: int
) -> None:
    assert check.check_stream(REFERENCE, pieces) == check.StreamVerdict(kind, at)


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert check.percentile(values, 0.5) == 50
    assert check.percentile(values, 0.99) == 99
    assert check.percentile([7.0], 0.99) == 7
    assert math.isnan(check.percentile([], 0.5))


def test_requests_in_flight_at_a_kill_are_the_moved_ones() -> None:
    spans = [(0.0, 1.0), (1.5, 4.0), (2.0, 2.5), (4.5, 9.0), (5.5, 6.0)]
    groups = check.latency_groups(spans, kill_times=[2.2, 5.0])
    assert groups["moved"] == {"count": 3, "p50_ms": 2500.0, "p99_ms": 4500.0}
    assert groups["undisturbed"] == {"count": 2, "p50_ms": 500.0, "p99_ms": 1000.0}
    assert not check.is_moved(0.0, 2.2, [2.2])
    assert check.is_moved(2.2, 3.0, [2.2])


@pytest.mark.parametrize(
    ("samples", "trend"),
    [
        ([(1, 100), (1, 105), (1, 109)], "flat"),
        ([(1, 100), (1, 150), (1, 200)], "growing"),
        ([(1, 100), (2, 300)], "restarted"),
        ([(1, 100), (2, 100), (2, 200)], "restarted"),
        ([(1, 100), (1, 300), (1, 105)], "flat"),
        ([(1, 100)], "unknown"),
        ([], "unknown"),
    ],
)
def test_memory_is_flat_or_growing_per_process(samples: list[tuple[int, int]], trend: str) -> None:
    assert check.memory_trend(samples) == trend


def test_new_shm_names_are_ours_by_pid_or_by_mapping() -> None:
    deploy = load("soak_deploy")
    names = {"epd-10-555-0", "epd-11-556-3", "epd-99-1-0", "sem.mp-ab", "sem.mp-cd", "lock"}
    assert deploy.ours(names, {10, 11}, {"sem.mp-ab", "epd-99-1-0"}) == {
        "epd-10-555-0",
        "epd-11-556-3",
        "epd-99-1-0",
        "sem.mp-ab",
    }


def test_the_flags_after_a_double_dash_go_to_epd_up_with_restarts_for_every_kill() -> None:
    bench = load("bench_soak")
    args, up = bench.parse_args(
        ["--requests", "1000", "--chaos", "--kill", "route@5", "--", "--topology", "e-pd"]
    )
    assert len(args.kills) == 9 and args.kills[0] == check.Kill("route", 5)
    assert up == ["--topology", "e-pd", "--max-restarts", "9"]
    assert bench.parse_args(["--", "--max-restarts", "1"])[1] == ["--max-restarts", "1"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--topology", "e-pd"])


def test_json_figures_carry_none_where_a_group_had_no_request() -> None:
    report = load("soak_report")
    figures = {"moved": {"count": 0, "p50_ms": math.nan}, "kills": [{"at_s": 1.5}]}
    assert report.without_nan(figures) == {
        "moved": {"count": 0, "p50_ms": None},
        "kills": [{"at_s": 1.5}],
    }


def test_figures_count_failures_and_time_only_the_ok_requests() -> None:
    bench, report, load_module = load("bench_soak"), load("soak_report"), load("soak_load")
    outcomes = [
        load_module.Outcome(0, 0, "ok", 10.0, 11.0, 0.2),
        load_module.Outcome(1, 1, "ok", 10.5, 13.0, 0.3),
        load_module.Outcome(2, 0, "failed", 12.0, 12.1, None, "HTTP 503: no worker"),
        load_module.Outcome(3, 1, "corrupted", 12.0, 14.0, 0.1, "repeated from piece 2"),
    ]
    fired = [load_module.Fired(check.Kill("prefill", 1), "prefill", 42, 12.0)]
    samples = {"prefill": [(42, 100 * 2**20), (43, 50 * 2**20)]}
    run = report.Soaked(outcomes, fired, [3.5], samples, 10.0, 4.0, 2)
    args = bench.parse_args(["--concurrency", "2", "--tokens", "3"])[0]
    figures = report.summarise(args, run)
    assert (figures["ok"], figures["failed"], figures["corrupted"]) == (2, 1, 1)
    assert figures["latency_p50_ms"] == 1000 and figures["latency_p99_ms"] == 2500
    assert figures["reasons"] == {"HTTP 503: no worker": 1, "repeated from piece 2": 1}
    assert figures["kills"][0] == {
        "role": "prefill",
        "signal": "SIGKILL",
        "service": "prefill",
        "pid": 42,
        "at_request": 1,
        "at_s": 2.0,
        "back_after_s": 3.5,
    }
    assert figures["latency_by_group"]["moved"]["count"] == 1
    assert figures["memory"]["prefill"]["trend"] == "restarted"
    assert not report.is_clean({**figures, "failed": 0, "corrupted": 0, "leaked_segments": ["x"]})
    assert report.is_clean({**figures, "failed": 0, "corrupted": 0, "leaked_segments": []})


def test_memory_rows_carry_the_largest_rss_of_each_quarter() -> None:
    report = load("soak_report")
    series = [(7, mib * 2**20) for mib in (100, 140, 110, 120, 150, 115, 118, 119)]
    row = report.memory_row(series)
    assert row["quarter_max_mib"] == [140.0, 120.0, 150.0, 119.0]
    assert (row["warm_mib"], row["end_mib"], row["max_mib"]) == (100.0, 119.0, 150.0)
    assert report.memory_row(series[:2])["quarter_max_mib"] == [100.0, 140.0]


def test_a_service_s_transfer_state_is_read_from_its_metrics() -> None:
    text = "\n".join(
        [
            "# TYPE epd_transfer_leases_outstanding gauge",
            'epd_transfer_leases_outstanding{kind="shm"} 2.0',
            'epd_transfer_leases_outstanding{kind="nixl"} 1.0',
            "# TYPE epd_transfer_leases_expired counter",
            'epd_transfer_leases_expired_total{kind="shm"} 3.0',
            'epd_transfer_leases_expired_created{kind="shm"} 1.7e9',
            "# TYPE epd_transfer_nixl_registered_regions gauge",
            "epd_transfer_nixl_registered_regions 4.0",
            "# TYPE epd_route_requests gauge",
            "epd_route_requests 9.0",
        ]
    )
    assert check.transfer_state(text + "\n") == {
        "leases_outstanding": 3.0,
        "leases_expired": 3.0,
        "nixl_regions": 4.0,
    }
    assert check.transfer_state("# TYPE epd_route_requests gauge\nepd_route_requests 1\n") == {}


def test_a_lease_outstanding_after_the_load_makes_the_soak_fail() -> None:
    report = load("soak_report")
    clean = {"failed": 0, "corrupted": 0, "leaked_segments": [], "leases_outstanding": 0}
    assert report.is_clean(clean)
    assert not report.is_clean({**clean, "leases_outstanding": 1})
