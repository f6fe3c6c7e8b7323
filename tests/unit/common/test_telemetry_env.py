"""Tracing honours OpenTelemetry's standard variables: the service name and resource, the
sampler, the exporter and its endpoint."""

from __future__ import annotations

import argparse

import pytest
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBasedTraceIdRatio

from epd.common.telemetry import make_exporter, new_provider, resource_of
from epd.common.telemetry_cli import add_telemetry_arguments, otel_exporter

OTEL_VARIABLES = (
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "EPD_TRACE_EXPORTER",
)


@pytest.fixture(autouse=True)
def no_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_the_service_name_is_ours_unless_otel_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resource_of("epd-route").attributes["service.name"] == "epd-route"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes,team=vision")
    attributes = resource_of("epd-route").attributes
    assert (attributes["service.name"], attributes["team"]) == ("from-attributes", "vision")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-route")
    assert resource_of("epd-route").attributes["service.name"] == "my-route"


def test_the_sampler_is_otels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    assert new_provider("epd-route").sampler is ALWAYS_OFF
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    sampler = new_provider("epd-route").sampler
    assert isinstance(sampler, ParentBasedTraceIdRatio)
    assert "0.25" in sampler.get_description()


@pytest.mark.parametrize(
    ("variables", "exporter"),
    [
        ({}, "none"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:1"}, "none"),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp-grpc"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4317"}, "otlp-grpc"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/v1/traces"}, "otlp-grpc"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "otlp-grpc",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "otlp-http",
        ),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            "otlp-http",
        ),
    ],
)
def test_the_exporter_otel_asks_for(variables: dict[str, str], exporter: str) -> None:
    assert otel_exporter(variables) == exporter


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, r"\$OTEL_TRACES_EXPORTER must be one of otlp"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "one exporter"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "grpc or"),
    ],
)
def test_an_exporter_epd_lacks_is_named(variables: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        otel_exporter(variables)


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_telemetry_arguments(parser)
    return parser.parse_args(list(flags))


def test_the_flag_and_epds_variable_win_over_otels(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse().trace_exporter == "none"
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    assert parse().trace_exporter == "console"
    monkeypatch.setenv("EPD_TRACE_EXPORTER", "json:/tmp/spans.jsonl")
    assert parse().trace_exporter == "json:/tmp/spans.jsonl"
    assert parse("--trace-exporter", "none").trace_exporter == "none"


def test_the_otlp_exporters_read_otels_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    made = make_exporter("otlp-http")
    assert made is not None
    assert made[0]._endpoint == "http://127.0.0.1:4318/v1/traces"  # type: ignore[attr-defined]
    made[0].shutdown()
