from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScalarType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCALAR_TYPE_UNSPECIFIED: _ClassVar[ScalarType]
    SCALAR_TYPE_FLOAT32: _ClassVar[ScalarType]
    SCALAR_TYPE_FLOAT16: _ClassVar[ScalarType]
    SCALAR_TYPE_BFLOAT16: _ClassVar[ScalarType]
    SCALAR_TYPE_INT64: _ClassVar[ScalarType]
    SCALAR_TYPE_INT32: _ClassVar[ScalarType]
    SCALAR_TYPE_UINT8: _ClassVar[ScalarType]

class TransferKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSFER_KIND_UNSPECIFIED: _ClassVar[TransferKind]
    TRANSFER_KIND_SHM: _ClassVar[TransferKind]
    TRANSFER_KIND_NIXL: _ClassVar[TransferKind]
    TRANSFER_KIND_INLINE: _ClassVar[TransferKind]

class NixlMemoryType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NIXL_MEMORY_TYPE_UNSPECIFIED: _ClassVar[NixlMemoryType]
    NIXL_MEMORY_TYPE_DRAM: _ClassVar[NixlMemoryType]
    NIXL_MEMORY_TYPE_VRAM: _ClassVar[NixlMemoryType]
SCALAR_TYPE_UNSPECIFIED: ScalarType
SCALAR_TYPE_FLOAT32: ScalarType
SCALAR_TYPE_FLOAT16: ScalarType
SCALAR_TYPE_BFLOAT16: ScalarType
SCALAR_TYPE_INT64: ScalarType
SCALAR_TYPE_INT32: ScalarType
SCALAR_TYPE_UINT8: ScalarType
TRANSFER_KIND_UNSPECIFIED: TransferKind
TRANSFER_KIND_SHM: TransferKind
TRANSFER_KIND_NIXL: TransferKind
TRANSFER_KIND_INLINE: TransferKind
NIXL_MEMORY_TYPE_UNSPECIFIED: NixlMemoryType
NIXL_MEMORY_TYPE_DRAM: NixlMemoryType
NIXL_MEMORY_TYPE_VRAM: NixlMemoryType

class ShmLocation(_message.Message):
    __slots__ = ("name", "offset", "size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    offset: int
    size: int
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class NixlDescriptor(_message.Message):
    __slots__ = ("address", "length", "device_id")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    address: int
    length: int
    device_id: int
    def __init__(self, address: _Optional[int] = ..., length: _Optional[int] = ..., device_id: _Optional[int] = ...) -> None: ...

class NixlLocation(_message.Message):
    __slots__ = ("agent_name", "agent_metadata", "memory_type", "descriptors")
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TYPE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    agent_name: str
    agent_metadata: bytes
    memory_type: NixlMemoryType
    descriptors: _containers.RepeatedCompositeFieldContainer[NixlDescriptor]
    def __init__(self, agent_name: _Optional[str] = ..., agent_metadata: _Optional[bytes] = ..., memory_type: _Optional[_Union[NixlMemoryType, str]] = ..., descriptors: _Optional[_Iterable[_Union[NixlDescriptor, _Mapping]]] = ...) -> None: ...

class TensorRef(_message.Message):
    __slots__ = ("dtype", "shape", "byte_size", "host_id", "lease_id", "lease_expire_time_ms", "producer_endpoint", "shm", "nixl", "inline_data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SHM_FIELD_NUMBER: _ClassVar[int]
    NIXL_FIELD_NUMBER: _ClassVar[int]
    INLINE_DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: ScalarType
    shape: _containers.RepeatedScalarFieldContainer[int]
    byte_size: int
    host_id: str
    lease_id: str
    lease_expire_time_ms: int
    producer_endpoint: str
    shm: ShmLocation
    nixl: NixlLocation
    inline_data: bytes
    def __init__(self, dtype: _Optional[_Union[ScalarType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., byte_size: _Optional[int] = ..., host_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., lease_expire_time_ms: _Optional[int] = ..., producer_endpoint: _Optional[str] = ..., shm: _Optional[_Union[ShmLocation, _Mapping]] = ..., nixl: _Optional[_Union[NixlLocation, _Mapping]] = ..., inline_data: _Optional[bytes] = ...) -> None: ...
