from epd.v1 import multimodal_pb2 as _multimodal_pb2
from epd.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EncodeRequest(_message.Message):
    __slots__ = ("request_id", "model", "items", "transfer_kind", "consumer_host_id", "consumer_device")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_KIND_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_HOST_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_DEVICE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    items: _containers.RepeatedCompositeFieldContainer[_multimodal_pb2.MediaItem]
    transfer_kind: _tensor_pb2.TransferKind
    consumer_host_id: str
    consumer_device: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., items: _Optional[_Iterable[_Union[_multimodal_pb2.MediaItem, _Mapping]]] = ..., transfer_kind: _Optional[_Union[_tensor_pb2.TransferKind, str]] = ..., consumer_host_id: _Optional[str] = ..., consumer_device: _Optional[str] = ...) -> None: ...

class EncodeResponse(_message.Message):
    __slots__ = ("item_index", "mm_hash", "embeddings", "grid", "cache_hit", "encoder_id", "encode_seconds")
    ITEM_INDEX_FIELD_NUMBER: _ClassVar[int]
    MM_HASH_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    GRID_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    ENCODER_ID_FIELD_NUMBER: _ClassVar[int]
    ENCODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    item_index: int
    mm_hash: str
    embeddings: _tensor_pb2.TensorRef
    grid: _multimodal_pb2.ImageGrid
    cache_hit: bool
    encoder_id: str
    encode_seconds: float
    def __init__(self, item_index: _Optional[int] = ..., mm_hash: _Optional[str] = ..., embeddings: _Optional[_Union[_tensor_pb2.TensorRef, _Mapping]] = ..., grid: _Optional[_Union[_multimodal_pb2.ImageGrid, _Mapping]] = ..., cache_hit: _Optional[bool] = ..., encoder_id: _Optional[str] = ..., encode_seconds: _Optional[float] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_ids",)
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("num_released",)
    NUM_RELEASED_FIELD_NUMBER: _ClassVar[int]
    num_released: int
    def __init__(self, num_released: _Optional[int] = ...) -> None: ...
