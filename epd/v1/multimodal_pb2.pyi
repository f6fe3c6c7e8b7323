from epd.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MediaItem(_message.Message):
    __slots__ = ("mm_hash", "url", "data", "pixels", "video", "key_salt", "image_settings")
    MM_HASH_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PIXELS_FIELD_NUMBER: _ClassVar[int]
    VIDEO_FIELD_NUMBER: _ClassVar[int]
    KEY_SALT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    mm_hash: str
    url: str
    data: bytes
    pixels: _tensor_pb2.TensorRef
    video: VideoSpan
    key_salt: str
    image_settings: str
    def __init__(self, mm_hash: _Optional[str] = ..., url: _Optional[str] = ..., data: _Optional[bytes] = ..., pixels: _Optional[_Union[_tensor_pb2.TensorRef, _Mapping]] = ..., video: _Optional[_Union[VideoSpan, _Mapping]] = ..., key_salt: _Optional[str] = ..., image_settings: _Optional[str] = ...) -> None: ...

class VideoSpan(_message.Message):
    __slots__ = ("first_frame", "num_frames", "resized_height", "resized_width", "video_settings")
    FIRST_FRAME_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    RESIZED_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    RESIZED_WIDTH_FIELD_NUMBER: _ClassVar[int]
    VIDEO_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    first_frame: int
    num_frames: int
    resized_height: int
    resized_width: int
    video_settings: str
    def __init__(self, first_frame: _Optional[int] = ..., num_frames: _Optional[int] = ..., resized_height: _Optional[int] = ..., resized_width: _Optional[int] = ..., video_settings: _Optional[str] = ...) -> None: ...

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

class VideoInput(_message.Message):
    __slots__ = ("mm_hash", "grid", "chunks", "chunk_hashes", "seconds_per_temporal_patch", "timestamps", "media", "fps", "num_decoded_frames", "frame_indices")
    MM_HASH_FIELD_NUMBER: _ClassVar[int]
    GRID_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_HASHES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_TEMPORAL_PATCH_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    NUM_DECODED_FRAMES_FIELD_NUMBER: _ClassVar[int]
    FRAME_INDICES_FIELD_NUMBER: _ClassVar[int]
    mm_hash: str
    grid: ImageGrid
    chunks: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorRef]
    chunk_hashes: _containers.RepeatedScalarFieldContainer[str]
    seconds_per_temporal_patch: float
    timestamps: _containers.RepeatedScalarFieldContainer[float]
    media: MediaItem
    fps: float
    num_decoded_frames: int
    frame_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, mm_hash: _Optional[str] = ..., grid: _Optional[_Union[ImageGrid, _Mapping]] = ..., chunks: _Optional[_Iterable[_Union[_tensor_pb2.TensorRef, _Mapping]]] = ..., chunk_hashes: _Optional[_Iterable[str]] = ..., seconds_per_temporal_patch: _Optional[float] = ..., timestamps: _Optional[_Iterable[float]] = ..., media: _Optional[_Union[MediaItem, _Mapping]] = ..., fps: _Optional[float] = ..., num_decoded_frames: _Optional[int] = ..., frame_indices: _Optional[_Iterable[int]] = ...) -> None: ...
