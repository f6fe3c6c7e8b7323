"""How ``epd up`` lays its services out on the CPUs it may use.

- ``shared``: every service may run on every CPU (the operating system schedules them).
- ``split``: the scheduler and the route share the first CPUs (one in eight, at least one); a
  service whose work is on an accelerator (an engine or encoder on the GPU) gets
  ``ACCELERATOR_SERVICE_CPUS`` for its Python loop; the CPU-bound services (engines and encoders
  on CPU) share the rest evenly, engines first for any remainder. Each pinned service sizes its
  threads from its CPUs, so no two roles' threads compete for a core.
- ``auto``: ``split`` when every CPU-bound service gets at least ``MIN_SPLIT_CPUS``, else
  ``shared``. On 2 cores, one core per role measured worse than sharing (docs/performance.md).

``--cpus NAME=LIST`` pins a service by hand; the layout then places the others on the CPUs no
such flag names.
"""

from __future__ import annotations

from dataclasses import dataclass

from epd.common.cpus import format_cpu_list, parse_cpu_list

LAYOUTS = ("auto", "shared", "split")
FRONT = ("scheduler", "route")
ACCELERATOR_SERVICE_CPUS = 2
MIN_SPLIT_CPUS = 2
FRONT_SHARE = 8


@dataclass(frozen=True, slots=True)
class Service:
    """A service ``epd up`` starts, and whether its heavy work runs on an accelerator."""

    name: str
    on_accelerator: bool = False


def parse_pins(specs: list[str], names: list[str]) -> dict[str, list[int]]:
    """``NAME=LIST`` flags as CPU lists by service name; ValueError for a malformed flag, a
    name this deployment does not start, or a name given twice."""
    pins: dict[str, list[int]] = {}
    for spec in specs:
        name, sep, cpus = spec.partition("=")
        if not sep or not name:
            raise ValueError(f"--cpus {spec!r}: expected NAME=LIST, e.g. prefill=0-3")
        if name not in names:
            raise ValueError(
                f"--cpus {spec!r}: this deployment has no service {name!r}; "
                f"it starts {', '.join(names)}"
            )
        if name in pins:
            raise ValueError(f"--cpus names {name!r} twice")
        pins[name] = parse_cpu_list(cpus)
    return pins


def lay_out(
    services: list[Service], allowed: list[int], layout: str, pins: dict[str, list[int]]
) -> dict[str, list[int]]:
    """The CPUs of each service to pin (a service left out runs on every CPU). ValueError when
    ``layout`` is unknown, a pin names a CPU not in ``allowed``, or ``split`` cannot give every
    CPU-bound service ``MIN_SPLIT_CPUS``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown CPU layout {layout!r}; one of {', '.join(LAYOUTS)}")
    taken = {cpu for cpus in pins.values() for cpu in cpus}
    outside = sorted(taken - set(allowed))
    if outside:
        raise ValueError(
            f"--cpus names CPUs {format_cpu_list(outside)}, which this process may not use "
            f"(it may use {format_cpu_list(allowed)})"
        )
    rest = [cpu for cpu in allowed if cpu not in taken]
    others = [service for service in services if service.name not in pins]
    if others and not rest:
        names = ", ".join(service.name for service in others)
        raise ValueError(f"--cpus gives every CPU to named services; none is left for {names}")
    split = _split(others, rest)
    if layout == "split" and split is None:
        bound = sum(not service.on_accelerator and service.name not in FRONT for service in others)
        raise ValueError(
            f"--cpu-layout split needs at least {MIN_SPLIT_CPUS} CPUs for each of {bound} "
            f"CPU-bound services besides the others' shares; {len(rest)} are free "
            "(use --cpu-layout shared)"
        )
    if layout != "shared" and split is not None:
        return {**split, **pins}
    if not pins:
        return {}
    return {**{service.name: rest for service in others}, **pins}


def _split(services: list[Service], cpus: list[int]) -> dict[str, list[int]] | None:
    front = [service for service in services if service.name in FRONT]
    accelerated = [s for s in services if s.on_accelerator and s.name not in FRONT]
    bound = [s for s in services if not s.on_accelerator and s.name not in FRONT]
    num_front = max(1, len(cpus) // FRONT_SHARE) if front else 0
    num_bound_cpus = len(cpus) - num_front - ACCELERATOR_SERVICE_CPUS * len(accelerated)
    if bound and num_bound_cpus < MIN_SPLIT_CPUS * len(bound):
        return None
    if not bound and num_bound_cpus < 0:
        return None
    plan = {service.name: cpus[:num_front] for service in front}
    start = num_front
    for service in accelerated:
        plan[service.name] = cpus[start : start + ACCELERATOR_SERVICE_CPUS]
        start += ACCELERATOR_SERVICE_CPUS
    for index, service in enumerate(bound):
        share = num_bound_cpus // len(bound) + (index < num_bound_cpus % len(bound))
        plan[service.name] = cpus[start : start + share]
        start += share
    return plan


def describe(plan: dict[str, list[int]]) -> str:
    """One line: each CPU list with the services pinned to it."""
    if not plan:
        return "every service on every CPU"
    by_cpus: dict[str, list[str]] = {}
    for name, cpus in plan.items():
        by_cpus.setdefault(format_cpu_list(cpus), []).append(name)
    return "; ".join(f"{'+'.join(names)} on {cpus}" for cpus, names in by_cpus.items())
