"""The figures of ``bench_e2e.py``: one ``Row`` per (system, concurrency, rate), the ratios
to vLLM's rows and to the ideal of mixed encoders, and the tables printed of them."""

from __future__ import annotations

from dataclasses import dataclass, field

FIELDS = [
    "system",
    "concurrency",
    "rate",
    "requests",
    "failed",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_ms",
    "output_tok_s",
    "req_s",
    "ttft_p50_vs_vllm",
    "tok_s_vs_vllm",
    "ttft_p50_vs_vllm_ec",
    "tok_s_vs_vllm_ec",
]


@dataclass
class Row:
    """One (system, concurrency) measurement."""

    system: str
    concurrency: int
    rate: float
    requests: int
    failed: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_ms: float
    output_tok_s: float
    req_s: float
    ttft_p50_vs_vllm: float | None = None
    tok_s_vs_vllm: float | None = None
    ttft_p50_vs_vllm_ec: float | None = None
    tok_s_vs_vllm_ec: float | None = None
    cpu_ms_per_request: dict[str, float] = field(default_factory=dict)
    share_of_ideal: float | None = None


def ratio(value: float, reference: float | None) -> float | None:
    """``value`` over ``reference`` to three places; None without a reference (or NaN)."""
    return round(value / reference, 3) if reference and reference == reference else None


def compare_to_vllm(rows: list[Row]) -> None:
    """Fill each row's ratios to the vllm and vllm-ec rows at the same concurrency and rate."""
    monolithic = {(r.concurrency, r.rate): r for r in rows if r.system == "vllm"}
    split = {(r.concurrency, r.rate): r for r in rows if r.system == "vllm-ec"}
    for row in rows:
        if (reference := monolithic.get((row.concurrency, row.rate))) is not None:
            row.ttft_p50_vs_vllm = ratio(row.ttft_p50_ms, reference.ttft_p50_ms)
            row.tok_s_vs_vllm = ratio(row.output_tok_s, reference.output_tok_s)
        if (reference := split.get((row.concurrency, row.rate))) is not None:
            row.ttft_p50_vs_vllm_ec = ratio(row.ttft_p50_ms, reference.ttft_p50_ms)
            row.tok_s_vs_vllm_ec = ratio(row.output_tok_s, reference.output_tok_s)


def share_of_ideal(rows: list[Row]) -> None:
    """Fill the share of the ideal of each row of a system whose encoders are on several devices
    (``e-pd:POLICY@cuda/cpu``): its req/s over the sum of the req/s of the same topology with one
    encoder on each of those devices alone (``e-pd@cuda`` + ``e-pd@cpu``), at the same
    concurrency and rate: 1.0 means the mixed encoders lose nothing of what each adds alone."""
    alone = {
        (r.system, r.concurrency, r.rate): r.req_s
        for r in rows
        if "@" in r.system and "/" not in r.system
    }
    for row in rows:
        system, _, devices = row.system.partition("@")
        if "/" not in devices:
            continue
        name = system.partition(":")[0]
        parts = [alone.get((f"{name}@{d}", row.concurrency, row.rate)) for d in devices.split("/")]
        if all(parts):
            row.share_of_ideal = ratio(row.req_s, sum(p for p in parts if p))


def print_ideal_table(rows: list[Row]) -> None:
    mixed = [r for r in rows if r.share_of_ideal is not None]
    if not mixed:
        return
    print("encoders on several devices: req/s against the sum of each device's alone (ideal)")
    for r in mixed:
        print(
            f"  {r.system:<32} concurrency {r.concurrency:>3}: {r.req_s:7.2f} req/s, "
            f"{r.share_of_ideal:.2f} of the ideal"
        )


def times(value: float | None) -> str:
    """A ratio for a table column: ``1.23x``, or ``-`` where there is none."""
    return f"{value:>7.2f}x" if value is not None else f"{'-':>8}"


def print_table(rows: list[Row]) -> None:
    print(
        f"{'system':<26}{'conc':>5}{'rate':>6}{'ok':>5}{'fail':>5}{'TTFT p50':>10}"
        f"{'TTFT p99':>10}{'TPOT':>8}{'tok/s':>8}{'req/s':>7}{'TTFT/vllm':>10}"
        f"{'tok/s/vllm':>11}{'TTFT/v-ec':>10}{'tok/s/v-ec':>11}"
    )
    for r in rows:
        print(
            f"{r.system:<26}{r.concurrency:>5}{r.rate:>6.1f}{r.requests:>5}{r.failed:>5}"
            f"{r.ttft_p50_ms:>8.0f}ms{r.ttft_p99_ms:>8.0f}ms{r.tpot_ms:>6.0f}ms"
            f"{r.output_tok_s:>8.1f}{r.req_s:>7.2f}  {times(r.ttft_p50_vs_vllm)}"
            f"  {times(r.tok_s_vs_vllm)}  {times(r.ttft_p50_vs_vllm_ec)}"
            f"  {times(r.tok_s_vs_vllm_ec)}"
        )


def print_cpu_table(rows: list[Row]) -> None:
    """CPU ms per request by process, one block per row; processes under 0.5 ms are summed
    into ``(others)``."""
    print("CPU time per request, ms (user+system, from /proc)")
    for r in rows:
        total = sum(r.cpu_ms_per_request.values())
        print(f"  {r.system} @ concurrency {r.concurrency}, rate {r.rate:g}: {total:.1f} ms")
        others = 0.0
        for name, ms in r.cpu_ms_per_request.items():
            if ms < 0.5:
                others += ms
            else:
                print(f"    {ms:>8.1f}  {name}")
        if others:
            print(f"    {others:>8.1f}  (others)")
