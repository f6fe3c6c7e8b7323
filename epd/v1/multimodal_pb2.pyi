from epd.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MediaItem(_message.Message):
    __slots__ = ("mm_hash", "url", "data", "pixels")
    MM_HASH_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PIXELS_FIELD_NUMBER: _ClassVar[int]
    mm_hash: str
    url: str
    data: bytes
    pixels: _tensor_pb2.TensorRef
    def __init__(self, mm_hash: _Optional[str] = ..., url: _Optional[str] = ..., data: _Optional[bytes] = ..., pixels: _Optional[_Union[_tensor_pb2.TensorRef, _Mapping]] = ...) -> None: ...

class ImageGrid(_message.Message):
    __slots__ = ("t", "h", "w")
    T_FIELD_NUMBER: _ClassVar[int]
    H_FIELD_NUMBER: _ClassVar[int]
    W_FIELD_NUMBER: _ClassVar[int]
    t: int
    h: int
    w: int
    def __init__(self, t: _Optional[int] = ..., h: _Optional[int] = ..., w: _Optional[int] = ...) -> None: ...

class ImageInput(_message.Message):
    __slots__ = ("mm_hash", "grid", "embeddings", "media")
    MM_HASH_FIELD_NUMBER: _ClassVar[int]
    GRID_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    mm_hash: str
    grid: ImageGrid
    embeddings: _tensor_pb2.TensorRef
    media: MediaItem
    def __init__(self, mm_hash: _Optional[str] = ..., grid: _Optional[_Union[ImageGrid, _Mapping]] = ..., embeddings: _Optional[_Union[_tensor_pb2.TensorRef, _Mapping]] = ..., media: _Optional[_Union[MediaItem, _Mapping]] = ...) -> None: ...
