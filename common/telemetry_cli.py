"""Telemetry flags shared by every service's command line, and applying them.

``--trace-exporter`` falls back on ``EPD_TRACE_EXPORTER``, then on OpenTelemetry's own
variables (``otel_exporter``); the SDK reads the others (``common/telemetry.py``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from opentelemetry.environment_variables import OTEL_TRACES_EXPORTER
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
)
from opentelemetry.sdk.trace import TracerProvider

from epd.common.flags import Flag, add_flag
from epd.common.telemetry import DEFAULT_SPAN_FILE_MB, configure_logging, configure_tracing


def mebibytes(text: str) -> int:
    """A flag's size in MiB: an integer, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of MiB, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more MiB, got {value}")
    return value


TRACE_EXPORTER = Flag(
    "where spans go: none, console, otlp-grpc[=ENDPOINT], otlp-http[=ENDPOINT] or json:PATH; "
    "without ENDPOINT the OTLP exporters read OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT",
    env="EPD_TRACE_EXPORTER",
    default_help="default: as OTEL_TRACES_EXPORTER says (otlp, over "
    "OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL: grpc or http/protobuf; console; none), else otlp when "
    "OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT is set, else none",
)
OTEL_EXPORTERS = {"none": "none", "console": "console"}
TRACE_FILE_MAX_MB = Flag(
    "json:PATH keeps at most this many MiB of spans in PATH and PATH.1, rotated when PATH "
    "reaches half; 0: no cap",
    env="EPD_TRACE_FILE_MAX_MB",
    type=mebibytes,
)
LOG_LEVEL = Flag(
    "log level", env="EPD_LOG_LEVEL", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR")
)


def otel_exporter(environ: Mapping[str, str]) -> str:
    """The ``--trace-exporter`` OpenTelemetry's variables in ``environ`` ask for (see
    ``TRACE_EXPORTER``'s default); ValueError naming ``OTEL_TRACES_EXPORTER`` when epd has no
    such exporter."""
    name = environ.get(OTEL_TRACES_EXPORTER, "").strip().lower()
    endpoint = environ.get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or environ.get(
        OTEL_EXPORTER_OTLP_ENDPOINT
    )
    if not name:
        name = "otlp" if endpoint else "none"
    if name in OTEL_EXPORTERS:
        return OTEL_EXPORTERS[name]
    if name != "otlp":
        raise ValueError(
            f"${OTEL_TRACES_EXPORTER} must be one of otlp, console, none (one exporter), "
            f"got {name!r}"
        )
    protocol = environ.get(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) or environ.get(
        OTEL_EXPORTER_OTLP_PROTOCOL, "grpc"
    )
    if protocol not in ("grpc", "http/protobuf"):
        raise ValueError(
            f"$OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL must be grpc or http/protobuf, got {protocol!r}"
        )
    return "otlp-grpc" if protocol == "grpc" else "otlp-http"


def add_telemetry_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --trace-exporter, --trace-file-max-mb and --log-level to ``parser``; ValueError
    naming an EPD_* or OTEL_* variable whose value is malformed."""
    group = parser.add_argument_group("telemetry")
    exporter = otel_exporter(os.environ)
    add_flag(group, "trace_exporter", TRACE_EXPORTER, default=exporter, kind=str)
    add_flag(group, "trace_file_max_mb", TRACE_FILE_MAX_MB, default=DEFAULT_SPAN_FILE_MB, kind=int)
    add_flag(group, "log_level", LOG_LEVEL, default="INFO", kind=str)


def configure_from_args(service_name: str, args: argparse.Namespace) -> TracerProvider:
    """Apply the flags added by ``add_telemetry_arguments``; returns the tracer provider."""
    configure_logging(args.log_level)
    return configure_tracing(service_name, args.trace_exporter, args.trace_file_max_mb << 20)
