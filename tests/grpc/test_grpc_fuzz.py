"""Random bytes and random messages at the route's and the scheduler's gRPC methods: never
INTERNAL, UNKNOWN or DEADLINE_EXCEEDED.

The route runs over in-memory peers (every worker answers at once, so nothing may time out), the
scheduler is the real one. Both run in a thread on their own event loop; the property tests are
synchronous and call them with raw bytes (valid messages are serialized first).
"""

from __future__ import annotations

import asyncio
import base64
import io
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from epd.common.server import EpdServer, ServiceBinding, build_server
from epd.scheduler.app import build_scheduler_server
from epd.scheduler.config import SchedulerConfig
from epd.server.media.grid import ImageGridder
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.route.app import SERVICE_NAME
from epd.server.route.prompt import PromptBuilder
from epd.server.route.router import Router
from epd.server.route.servicer import RouteServicer
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from tests.unit.route.fakes import FakePeers

T = TypeVar("T")
NEVER = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED}
FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ROUTE = route_service_pb2.DESCRIPTOR.services_by_name["RouteService"]
SCHEDULER = scheduler_pb.DESCRIPTOR.services_by_name["SchedulerService"]

# --- Random messages of any type, from its descriptor --------------------------------------------

_INTEGERS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def scalars(field: Any) -> st.SearchStrategy[Any]:
    """Values of a scalar field: extremes and small numbers alike, any text, any bytes."""
    if field.type in _INTEGERS:
        low, high = _INTEGERS[field.type]
        small = st.integers(max(low, -3), 10)
        if field.type == FieldDescriptor.TYPE_ENUM:
            small = st.sampled_from([value.number for value in field.enum_type.values])
        return st.one_of(small, st.sampled_from([low, high]), st.integers(low, high))
    if field.type == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32)
    if field.type == FieldDescriptor.TYPE_DOUBLE:
        return st.floats()
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_STRING:
        return st.text(max_size=24)
    return st.binary(max_size=48)


def messages(descriptor: Any, depth: int = 3) -> st.SearchStrategy[Message]:
    """Messages of type ``descriptor`` with a random subset of fields set, nested ``depth`` deep."""
    fields = [f for f in descriptor.fields if depth > 0 or f.type != FieldDescriptor.TYPE_MESSAGE]
    values = {f.name: st.none() | _values(f, depth) for f in fields}
    return st.fixed_dictionaries(values).map(lambda drawn: _build(descriptor, drawn))


def _values(field: Any, depth: int) -> st.SearchStrategy[Any]:
    if _is_map(field):
        key, value = (
            field.message_type.fields_by_name["key"],
            field.message_type.fields_by_name["value"],
        )
        return st.dictionaries(scalars(key), _one_value(value, depth - 1), max_size=3)
    one = _one_value(field, depth - 1)
    return st.lists(one, max_size=3) if _is_repeated(field) else one


def _one_value(field: Any, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return messages(field.message_type, depth)
    return scalars(field)


def _build(descriptor: Any, drawn: dict[str, Any]) -> Message:
    message = message_factory.GetMessageClass(descriptor)()
    for name, value in drawn.items():
        if value is None:
            continue
        field = descriptor.fields_by_name[name]
        target = getattr(message, name)
        if _is_map(field):
            for key, item in value.items():
                if isinstance(item, Message):
                    target[key].CopyFrom(item)
                else:
                    target[key] = item
        elif _is_repeated(field) and field.type == FieldDescriptor.TYPE_MESSAGE:
            for item in value:
                target.add().CopyFrom(item)
        elif _is_repeated(field):
            target.extend(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            target.CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


def _is_repeated(field: Any) -> bool:
    return bool(field.is_repeated)


def _is_map(field: Any) -> bool:
    return bool(
        _is_repeated(field)
        and field.type == FieldDescriptor.TYPE_MESSAGE
        and field.message_type.GetOptions().map_entry
    )


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[bytes]) -> bytes:
    """A serialized message with a few bytes overwritten, inserted or cut off."""
    data = bytearray(draw(valid))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        byte = draw(st.integers(0, 255))
        edit = draw(st.sampled_from(["overwrite", "insert", "truncate"]))
        if edit == "overwrite" and at < len(data):
            data[at] = byte
        elif edit == "insert":
            data.insert(at, byte)
        else:
            del data[at:]
    return bytes(data)


def payloads(descriptor: Any, *valid: st.SearchStrategy[Message]) -> st.SearchStrategy[bytes]:
    """Bytes for a method taking ``descriptor``: random, random messages, and their mutations."""
    serialized = st.one_of(messages(descriptor), *valid).map(lambda m: m.SerializeToString())
    return st.one_of(st.binary(max_size=96), serialized, mutated(serialized))


# --- Chat requests the route may take ------------------------------------------------------------


def png(width: int = 40, height: int = 30) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = png()
URLS = [
    f"data:image/png;base64,{base64.b64encode(PNG).decode()}",
    "data:image/png;base64,!!!",
    "data:,",
    "data:image/png;base64,",
    "http://10.0.0.1/a.png",
    "http://127.0.0.1:1/a.png",
    "file:///etc/passwd",
    "ftp://x/y.png",
    "",
]
IMAGES = st.one_of(
    st.builds(multimodal_pb2.MediaItem, url=st.sampled_from(URLS) | st.text(max_size=32)),
    st.builds(multimodal_pb2.MediaItem, data=st.sampled_from([PNG, b""]) | st.binary(max_size=64)),
    st.builds(multimodal_pb2.MediaItem, mm_hash=st.text(max_size=16), url=st.sampled_from(URLS)),
)
PARTS = st.one_of(
    st.builds(route_service_pb2.ContentPart, text=st.text(max_size=40)),
    st.builds(route_service_pb2.ContentPart, image=IMAGES),
    st.just(route_service_pb2.ContentPart()),
)
CHATS = st.builds(
    route_service_pb2.ChatMessage,
    role=st.sampled_from(["user", "user", "system", "assistant", "", "tool"]),
    content=st.lists(PARTS, max_size=3),
)
GENERATE_REQUESTS = st.builds(
    route_service_pb2.GenerateRequest,
    request_id=st.text(max_size=24),
    model=st.sampled_from(["", "tiny", "tiny", "x"]),
    messages=st.lists(CHATS, min_size=1, max_size=3),
    sampling=messages(generation_pb2.SamplingParams.DESCRIPTOR),
    encoder_policy=st.integers(-3, 8),
)

# --- Servers -------------------------------------------------------------------------------------


async def start_route(model_dir: Path) -> EpdServer:
    prompts = PromptBuilder(model_dir)
    loader = MediaLoader(MediaPolicy(), model_id="tiny", processor_fingerprint="x")
    peers: Any = FakePeers()
    grids = ImageGridder(model_dir)
    worker = Router(peers, prompts, loader, model_id="tiny", host_id="h", grids=grids)
    binding = ServiceBinding(
        SERVICE_NAME,
        RouteServicer(worker),
        route_service_pb2_grpc.add_RouteServiceServicer_to_server,
    )
    server, _ = await build_server([binding])
    await server.mark_serving()
    return server


async def start_scheduler() -> EpdServer:
    server, _ = await build_scheduler_server(config=SchedulerConfig(ttl_s=30))
    return server


@pytest.fixture(scope="module")
def channels(tiny_model_dir: Path) -> Iterator[dict[str, grpc.Channel]]:
    """Channels to a route and a scheduler served from a thread of their own."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(60)

    servers = {"route": run(start_route(tiny_model_dir)), "scheduler": run(start_scheduler())}
    opened = {name: grpc.insecure_channel(f"127.0.0.1:{s.port}") for name, s in servers.items()}
    yield opened
    for name, server in servers.items():
        opened[name].close()
        run(server.drain_and_stop(0))
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def call(channel: grpc.Channel, method: MethodDescriptor, payload: bytes) -> grpc.RpcError | None:
    """Send ``payload`` as it is to ``method``; the error the call ended with, if any."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    try:
        if method.server_streaming:
            for _ in channel.unary_stream(path)(payload, timeout=10):
                pass
        else:
            channel.unary_unary(path)(payload, timeout=10)
    except grpc.RpcError as error:
        return error
    return None


def assert_answered(channel: grpc.Channel, method: MethodDescriptor, payload: bytes) -> None:
    error = call(channel, method, payload)
    if error is not None:
        code: Callable[[], grpc.StatusCode] = error.code  # type: ignore[attr-defined]
        assert code() not in NEVER, f"{method.name}({payload!r}): {error}"


# --- Properties ----------------------------------------------------------------------------------


@FUZZ
@given(
    payload=st.one_of(
        GENERATE_REQUESTS.map(lambda request: request.SerializeToString()),
        payloads(route_service_pb2.GenerateRequest.DESCRIPTOR, GENERATE_REQUESTS),
    )
)
def test_route_generate_never_fails_internally(channels: Any, payload: bytes) -> None:
    assert_answered(channels["route"], ROUTE.methods_by_name["Generate"], payload)


@FUZZ
@given(data=st.data())
def test_scheduler_methods_never_fail_internally(channels: Any, data: st.DataObject) -> None:
    method = data.draw(st.sampled_from(list(SCHEDULER.methods)))
    payload = data.draw(payloads(method.input_type))
    assert_answered(channels["scheduler"], method, payload)


@pytest.mark.parametrize("data", [b"\x01", b"abc"])
def test_image_bytes_too_short_for_any_signature_are_invalid(channels: Any, data: bytes) -> None:
    part = route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=data))
    chat = route_service_pb2.ChatMessage(role="user", content=[part])
    payload = route_service_pb2.GenerateRequest(messages=[chat]).SerializeToString()
    error = call(channels["route"], ROUTE.methods_by_name["Generate"], payload)
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
