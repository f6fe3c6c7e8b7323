from epd.v1 import generation_pb2 as _generation_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "model", "prompt", "sampling")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    prompt: _generation_pb2.Prompt
    sampling: _generation_pb2.SamplingParams
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt: _Optional[_Union[_generation_pb2.Prompt, _Mapping]] = ..., sampling: _Optional[_Union[_generation_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("first_token_id", "finish_reason", "kv_handle", "usage", "first_token_logprobs", "prompt_logprobs")
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    KV_HANDLE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    first_token_id: int
    finish_reason: _generation_pb2.FinishReason
    kv_handle: _generation_pb2.KvHandle
    usage: _generation_pb2.Usage
    first_token_logprobs: _generation_pb2.TokenLogprobs
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_generation_pb2.TokenLogprobs]
    def __init__(self, first_token_id: _Optional[int] = ..., finish_reason: _Optional[_Union[_generation_pb2.FinishReason, str]] = ..., kv_handle: _Optional[_Union[_generation_pb2.KvHandle, _Mapping]] = ..., usage: _Optional[_Union[_generation_pb2.Usage, _Mapping]] = ..., first_token_logprobs: _Optional[_Union[_generation_pb2.TokenLogprobs, _Mapping]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_generation_pb2.TokenLogprobs, _Mapping]]] = ...) -> None: ...

class PrefillDecodeRequest(_message.Message):
    __slots__ = ("request_id", "model", "prompt", "sampling")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    prompt: _generation_pb2.Prompt
    sampling: _generation_pb2.SamplingParams
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt: _Optional[_Union[_generation_pb2.Prompt, _Mapping]] = ..., sampling: _Optional[_Union[_generation_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class PrefillDecodeResponse(_message.Message):
    __slots__ = ("token_ids", "finish_reason", "usage", "logprobs", "prompt_logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: _generation_pb2.FinishReason
    usage: _generation_pb2.Usage
    logprobs: _containers.RepeatedCompositeFieldContainer[_generation_pb2.TokenLogprobs]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_generation_pb2.TokenLogprobs]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[_generation_pb2.FinishReason, str]] = ..., usage: _Optional[_Union[_generation_pb2.Usage, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[_generation_pb2.TokenLogprobs, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_generation_pb2.TokenLogprobs, _Mapping]]] = ...) -> None: ...
