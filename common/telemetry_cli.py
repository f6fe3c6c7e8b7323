"""Telemetry flags shared by every service's command line, and applying them."""

from __future__ import annotations

import argparse

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
    "where spans go: none, console, otlp-grpc[=ENDPOINT], otlp-http[=ENDPOINT] or json:PATH",
    env="EPD_TRACE_EXPORTER",
)
TRACE_FILE_MAX_MB = Flag(
    "json:PATH keeps at most this many MiB of spans in PATH and PATH.1, rotated when PATH "
    "reaches half; 0: no cap",
    env="EPD_TRACE_FILE_MAX_MB",
    type=mebibytes,
)
LOG_LEVEL = Flag(
    "log level", env="EPD_LOG_LEVEL", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR")
)


def add_telemetry_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --trace-exporter, --trace-file-max-mb and --log-level to ``parser``; ValueError
    naming an EPD_* variable whose value is malformed."""
    group = parser.add_argument_group("telemetry")
    add_flag(group, "trace_exporter", TRACE_EXPORTER, default="none", kind=str)
    add_flag(group, "trace_file_max_mb", TRACE_FILE_MAX_MB, default=DEFAULT_SPAN_FILE_MB, kind=int)
    add_flag(group, "log_level", LOG_LEVEL, default="INFO", kind=str)


def configure_from_args(service_name: str, args: argparse.Namespace) -> TracerProvider:
    """Apply the flags added by ``add_telemetry_arguments``; returns the tracer provider."""
    configure_logging(args.log_level)
    return configure_tracing(service_name, args.trace_exporter, args.trace_file_max_mb << 20)
