"""Tracing and logging set-up shared by every process.

Traces: one OpenTelemetry TracerProvider per process, exporting where ``--trace-exporter`` says:
``none`` (default), ``console``, ``otlp-grpc[=ENDPOINT]``, ``otlp-http[=ENDPOINT]`` or
``json:PATH`` (one JSON span per line appended to PATH, shared safely by several processes; PATH
and its rotated PATH.1 hold at most ``--trace-file-max-mb`` together, see ``capped_file``).
Trace context crosses processes in gRPC metadata through the instrumentation interceptors that
``build_server`` and ``create_channel`` install while ``traces_rpcs()`` holds: when spans go
somewhere. With ``none`` no interceptor is installed, because they cost ~0.3-0.6 ms per call on a
2-core machine (more than the call itself) for spans nobody reads.

The SDK reads OpenTelemetry's standard variables itself: ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (over the service's own name), ``OTEL_TRACES_SAMPLER`` and its
``_ARG``, ``OTEL_SDK_DISABLED``, ``OTEL_BSP_*``, and for the OTLP exporters
``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``, ``_HEADERS``, ``_TIMEOUT``, ``_CERTIFICATE`` and the like;
``telemetry_cli`` picks the exporter from ``OTEL_TRACES_EXPORTER`` when ``--trace-exporter`` is
not given.

Logs: one line per record with the current trace and span ids, so logs and traces join.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from epd.common import capped_file

DEFAULT_SPAN_FILE_MB = 64

FIRST_TOKEN_EVENT = "epd.first_token"
"""Span event where a request's first token passes: the prefill worker's ``PrefillDecode`` (ready
to send) and the route's request (received from the engine)."""

_lock = threading.Lock()
_specs_by_provider: weakref.WeakKeyDictionary[TracerProvider, set[str]] = (
    weakref.WeakKeyDictionary()
)


class JsonLinesSpanExporter(SpanExporter):
    """Appends each finished span as one JSON object per line to a file; the file and its
    rotated ``.1`` hold at most ``max_bytes`` together (0: no cap)."""

    def __init__(self, path: str, max_bytes: int = DEFAULT_SPAN_FILE_MB << 20) -> None:
        self._path = path
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(span.to_json(indent=None) + "\n" for span in spans)
        with self._lock:
            capped_file.append(self._path, lines.encode(), self._max_bytes)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class _EpdTracerProvider(TracerProvider):
    """The SDK provider ``configure_tracing`` installs; it knows whether spans go anywhere."""

    exports = False

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        self.exports = True


def traces_rpcs() -> bool:
    """Whether gRPC servers and channels built from now on should trace their calls.

    True when the process-wide provider hands spans to a processor: one added by
    ``configure_tracing``'s exporter or by the embedding application (any SDK provider that
    ``configure_tracing`` did not make counts as exporting). False for the API's no-op provider.
    """
    provider = trace.get_tracer_provider()
    if isinstance(provider, _EpdTracerProvider):
        return provider.exports
    return isinstance(provider, TracerProvider)


def make_exporter(
    spec: str, span_file_bytes: int = DEFAULT_SPAN_FILE_MB << 20
) -> tuple[SpanExporter, bool] | None:
    """Parse an exporter spec; returns (exporter, export_synchronously) or None for "none".
    ``span_file_bytes`` caps a ``json:PATH`` file with its rotated copy (0: no cap)."""
    kind, _, target = spec.partition("=")
    if spec.startswith("json:"):
        path = spec.removeprefix("json:")
        if not path:
            raise ValueError("json exporter needs a path: json:PATH")
        return JsonLinesSpanExporter(path, span_file_bytes), True
    if kind == "none":
        return None
    if kind == "console":
        return ConsoleSpanExporter(), True
    if kind == "otlp-grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=target or None), False
    if kind == "otlp-http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter(endpoint=target or None), False
    raise ValueError(
        f"unknown trace exporter {spec!r}: use none, console, otlp-grpc[=ENDPOINT], "
        "otlp-http[=ENDPOINT] or json:PATH"
    )


def add_exporter(
    provider: TracerProvider, spec: str, span_file_bytes: int = DEFAULT_SPAN_FILE_MB << 20
) -> bool:
    """Make ``provider`` export to ``spec`` (see ``make_exporter``) unless it already does.

    Returns True when an exporter was added; "none" and a spec added before add nothing, so
    repeated set-up never exports a span twice.
    """
    with _lock:
        added = _specs_by_provider.setdefault(provider, set())
        if spec in added:
            return False
        parsed = make_exporter(spec, span_file_bytes)
        added.add(spec)
        if parsed is None:
            return False
        span_exporter, synchronous = parsed
        processor = SimpleSpanProcessor if synchronous else BatchSpanProcessor
        provider.add_span_processor(processor(span_exporter))
        return True


def configure_tracing(
    service_name: str,
    exporter: str | None = None,
    span_file_bytes: int = DEFAULT_SPAN_FILE_MB << 20,
) -> TracerProvider:
    """Install (once per process) and return the SDK tracer provider for ``service_name``.

    ``exporter`` defaults to "none". Idempotent: the global provider is set only once (the first
    ``service_name`` names the resource, unless ``OTEL_SERVICE_NAME`` or
    ``OTEL_RESOURCE_ATTRIBUTES`` name it), and calling again with another exporter adds it to
    that provider, with the same one adds nothing. The sampler is the SDK's default, which
    reads ``OTEL_TRACES_SAMPLER``.
    """
    spec = exporter or "none"
    make_exporter(spec)  # NOTE: a bad spec fails here, before the global provider is touched
    with _lock:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = new_provider(service_name)
            trace.set_tracer_provider(provider)
    add_exporter(provider, spec, span_file_bytes)
    return provider


def new_provider(service_name: str) -> TracerProvider:
    """A tracer provider for ``service_name`` (``resource_of``) with the SDK's sampler, which
    ``OTEL_TRACES_SAMPLER`` chooses."""
    return _EpdTracerProvider(resource=resource_of(service_name))


def resource_of(service_name: str) -> Resource:
    """The process's resource: ``service_name`` and the SDK's detected attributes, under those
    of ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` (the SDK reads them)."""
    return Resource.create({SERVICE_NAME: service_name}).merge(OTELResourceDetector().detect())


def tracer(name: str) -> trace.Tracer:
    """The tracer for instrumenting module ``name``."""
    return trace.get_tracer(name)


class TraceContextFilter(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` (hex, or "-") of the current span to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        record.trace_id = f"{context.trace_id:032x}" if context.is_valid else "-"
        record.span_id = f"{context.span_id:016x}" if context.is_valid else "-"
        return True


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s trace=%(trace_id)s span=%(span_id)s %(message)s"


class SingleLineFormatter(logging.Formatter):
    """``LOG_FORMAT`` with newlines (multi-line messages, tracebacks) escaped as ``\\n``, so one
    record is always one line for grep and log shippers."""

    def __init__(self) -> None:
        super().__init__(LOG_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\n", "\\n")


def configure_logging(level: str | None = None) -> None:
    """Log one line per record to stderr with trace ids, at ``level`` (default INFO).

    Replaces the root logger's handlers, so calling it twice does not duplicate lines.
    """
    handler = logging.StreamHandler()
    handler.addFilter(TraceContextFilter())
    handler.setFormatter(SingleLineFormatter())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel((level or "INFO").upper())
