"""Print the policy comparison for every scenario: ``python -m epd.scheduler.sim [--json]``."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from epd.scheduler.sim.engine import simulate
from epd.scheduler.sim.model import SCENARIOS


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m epd.scheduler.sim", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[s.name for s in SCENARIOS],
        help="run only these scenarios (repeatable)",
    )
    args = parser.parse_args()
    chosen = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]
    results = {s.name: simulate(s) for s in chosen}
    if args.json:
        print(json.dumps({name: [asdict(r) for r in rows] for name, rows in results.items()}))
        return 0
    for scenario in chosen:
        print(f"\n{scenario.name}: {scenario.description} ({scenario.arrival_rps:g} req/s offered)")
        print(f"  {'policy':<12} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8}  utilisation; split")
        for row in results[scenario.name]:
            use = ", ".join(f"{name} {value:.0%}" for name, value in row.utilisation.items())
            use += "; " + "/".join(f"{value:.0%}" for value in row.split.values())
            print(
                f"  {row.policy:<12} {row.throughput_rps:7.1f} {row.p50_ms:8.1f} "
                f"{row.p99_ms:8.1f}  {use}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
