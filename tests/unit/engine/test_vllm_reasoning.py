"""The engines know the reasoning parser (``--reasoning-parser``, on ``epd up`` and on each
worker), and the request options vLLM's engine reads beside the sampling cross the proto:
thinking_token_budget, repetition_detection, vllm_xargs, and where a structured output starts
(reasoning_ended, the chat template arguments for the engine's reasoning parser)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from epd.common.errors import EpdError, InvalidArgument
from epd.launch import up_cli
from epd.launch.up_engine import engine_settings
from epd.server.engine.base import RepetitionDetection, Sampling, StructuredOutput
from epd.server.engine.engine_cli import engine_options
from epd.server.engine.vllm_args import engine_args
from epd.server.engine.vllm_inputs import generate_options, sampling_params
from epd.server.prefill import cli as prefill_cli
from epd.server.route.sampling import check_sampling, sampling_to_proto
from epd.server.worker import convert
from epd.v1 import generation_pb2


def worker_args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="epd prefill")
    prefill_cli.add_arguments(parser)
    return parser.parse_args(["--model", "/m", *flags])


@pytest.fixture(autouse=True)
def no_parser_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EPD_REASONING_PARSER", raising=False)


def test_epd_up_gives_the_routes_reasoning_parser_to_every_engine(tiny_model_dir: Path) -> None:
    parser = argparse.ArgumentParser(prog="epd up")
    up_cli.add_arguments(parser)
    _, flags = engine_settings(parser.parse_args(["--reasoning-parser", "deepseek_r1"]), "cpu", 2)
    assert flags[-2:] == ("--reasoning-parser", "deepseek_r1")
    options = engine_options(worker_args(*flags), "kv_producer", "cpu")
    assert options.reasoning_parser == "deepseek_r1"
    args = engine_args(tiny_model_dir, "tiny", options)
    assert args.reasoning_parser == "deepseek_r1", "vLLM derives its reasoning config from it"
    assert (
        engine_args(
            tiny_model_dir, "tiny", engine_options(worker_args(), None, "cpu")
        ).reasoning_parser
        == ""
    )


def test_a_worker_names_the_parser_in_its_help_and_refuses_an_unknown_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser(prog="epd prefill")
    prefill_cli.add_arguments(parser)
    assert "--reasoning-parser" in parser.format_help()
    with pytest.raises(ValueError, match="--reasoning-parser nope: no such parser.*deepseek_r1"):
        engine_options(worker_args("--reasoning-parser", "nope"), None, "cpu")


def test_the_request_options_cross_the_proto_to_vllms_sampling_params() -> None:
    from vllm import SamplingParams
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "thinking_token_budget": 3,
        "repetition_detection": {"max_pattern_size": 4, "min_pattern_size": 2, "min_count": 3},
        "vllm_xargs": {"mode": "fast", "weights": [1, 2.5]},
    }
    request = ChatCompletionRequest.model_validate(body)
    vllm_params = request.to_sampling_params(8, {})
    message = sampling_to_proto(vllm_params, request)
    sampling = convert.sampling_from_proto(
        generation_pb2.SamplingParams.FromString(message.SerializeToString())
    )
    assert sampling.thinking_token_budget == 3
    assert sampling.repetition_detection == RepetitionDetection(4, 2, 3)
    assert json.loads(sampling.vllm_xargs) == {"mode": "fast", "weights": [1, 2.5]}
    assert sampling.beyond_basics() == [
        "thinking_token_budget",
        "repetition_detection",
        "vllm_xargs",
    ], "what the transformers engine refuses by name"
    params: SamplingParams = sampling_params(
        sampling, kv_transfer_params={"do_remote_decode": True}
    )
    assert params.thinking_token_budget == vllm_params.thinking_token_budget == 3
    assert params.repetition_detection == vllm_params.repetition_detection
    assert params.extra_args == {
        **vllm_params.extra_args,
        "kv_transfer_params": {"do_remote_decode": True},
    }
    unset = sampling_params(convert.sampling_from_proto(generation_pb2.SamplingParams()))
    assert (unset.thinking_token_budget, unset.repetition_detection, unset.extra_args) == (
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("sampling", "param"),
    [
        (Sampling(repetition_detection=RepetitionDetection(4, 0, 1)), None),
        (Sampling(vllm_xargs="[1]"), "vllm_xargs"),
        (Sampling(vllm_xargs='{"kv_transfer_params": {}}'), "vllm_xargs"),
    ],
)
def test_bad_request_options_are_refused_as_invalid_arguments(
    sampling: Sampling, param: str | None
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        sampling_params(sampling)
    assert (caught.value.metadata or {}).get("param") == param


def test_a_structured_outputs_start_reaches_vllms_generate() -> None:
    constraint = generation_pb2.StructuredOutput(regex="a+", reasoning_ended=False)
    constraint.chat_template_kwargs = json.dumps({"enable_thinking": True})
    sampling = convert.sampling_from_proto(
        generation_pb2.SamplingParams(structured_output=constraint)
    )
    assert sampling.structured_output is not None
    assert sampling.structured_output.reasoning_ended is False
    assert generate_options(sampling) == {
        "reasoning_ended": False,
        "reasoning_parser_kwargs": {"chat_template_kwargs": {"enable_thinking": True}},
    }
    unset = convert.sampling_from_proto(
        generation_pb2.SamplingParams(structured_output=generation_pb2.StructuredOutput(regex="a"))
    )
    assert generate_options(unset) == {"reasoning_ended": None}, "the engine judges the prompt"
    assert generate_options(Sampling()) == {}
    assert generate_options(Sampling(structured_output=StructuredOutput("regex", "a"))) == {
        "reasoning_ended": None
    }


def test_the_route_refuses_vllm_xargs_naming_epds_kv_handoff_as_the_engine_would() -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "vllm_xargs": {"kv_transfer_params": "x"},
    }
    request = ChatCompletionRequest.model_validate(body)
    with pytest.raises(EpdError) as caught:
        sampling_to_proto(request.to_sampling_params(8, {}), request)
    assert (caught.value.metadata or {}).get("param") == "vllm_xargs"
    grpc_door = generation_pb2.SamplingParams(vllm_xargs='{"kv_transfer_params": "x"}')
    with pytest.raises(EpdError) as caught:
        check_sampling(grpc_door)
    assert (caught.value.metadata or {}).get("param") == "vllm_xargs"
