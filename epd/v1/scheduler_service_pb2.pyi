from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_ROLE_UNSPECIFIED: _ClassVar[WorkerRole]
    WORKER_ROLE_ENCODE: _ClassVar[WorkerRole]
    WORKER_ROLE_PREFILL: _ClassVar[WorkerRole]
    WORKER_ROLE_DECODE: _ClassVar[WorkerRole]
    WORKER_ROLE_PREFILL_DECODE: _ClassVar[WorkerRole]
    WORKER_ROLE_ENCODE_PREFILL: _ClassVar[WorkerRole]

class EncoderPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCODER_POLICY_UNSPECIFIED: _ClassVar[EncoderPolicy]
    ENCODER_POLICY_PER_IMAGE: _ClassVar[EncoderPolicy]
    ENCODER_POLICY_PER_REQUEST: _ClassVar[EncoderPolicy]
    ENCODER_POLICY_ADAPTIVE: _ClassVar[EncoderPolicy]

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_LIVE: _ClassVar[WorkerState]
    WORKER_STATE_DRAINING: _ClassVar[WorkerState]
WORKER_ROLE_UNSPECIFIED: WorkerRole
WORKER_ROLE_ENCODE: WorkerRole
WORKER_ROLE_PREFILL: WorkerRole
WORKER_ROLE_DECODE: WorkerRole
WORKER_ROLE_PREFILL_DECODE: WorkerRole
WORKER_ROLE_ENCODE_PREFILL: WorkerRole
ENCODER_POLICY_UNSPECIFIED: EncoderPolicy
ENCODER_POLICY_PER_IMAGE: EncoderPolicy
ENCODER_POLICY_PER_REQUEST: EncoderPolicy
ENCODER_POLICY_ADAPTIVE: EncoderPolicy
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_LIVE: WorkerState
WORKER_STATE_DRAINING: WorkerState

class WorkerInfo(_message.Message):
    __slots__ = ("id", "role", "endpoint", "device", "weight", "capacity", "host_id", "model", "embeddings_device")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_DEVICE_FIELD_NUMBER: _ClassVar[int]
    id: str
    role: WorkerRole
    endpoint: str
    device: str
    weight: float
    capacity: int
    host_id: str
    model: str
    embeddings_device: str
    def __init__(self, id: _Optional[str] = ..., role: _Optional[_Union[WorkerRole, str]] = ..., endpoint: _Optional[str] = ..., device: _Optional[str] = ..., weight: _Optional[float] = ..., capacity: _Optional[int] = ..., host_id: _Optional[str] = ..., model: _Optional[str] = ..., embeddings_device: _Optional[str] = ...) -> None: ...

class WorkerLoad(_message.Message):
    __slots__ = ("queue_depth", "num_in_flight", "item_latency_ms", "kv_usage", "stored_block_hashes", "removed_block_hashes", "held_items", "batches_finished")
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    NUM_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ITEM_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    STORED_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    REMOVED_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    HELD_ITEMS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FINISHED_FIELD_NUMBER: _ClassVar[int]
    queue_depth: int
    num_in_flight: int
    item_latency_ms: float
    kv_usage: float
    stored_block_hashes: _containers.RepeatedScalarFieldContainer[int]
    removed_block_hashes: _containers.RepeatedScalarFieldContainer[int]
    held_items: HeldItems
    batches_finished: int
    def __init__(self, queue_depth: _Optional[int] = ..., num_in_flight: _Optional[int] = ..., item_latency_ms: _Optional[float] = ..., kv_usage: _Optional[float] = ..., stored_block_hashes: _Optional[_Iterable[int]] = ..., removed_block_hashes: _Optional[_Iterable[int]] = ..., held_items: _Optional[_Union[HeldItems, _Mapping]] = ..., batches_finished: _Optional[int] = ...) -> None: ...

class HeldItems(_message.Message):
    __slots__ = ("is_snapshot", "added_mm_hashes", "evicted_mm_hashes", "stored_mm_hashes")
    IS_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    ADDED_MM_HASHES_FIELD_NUMBER: _ClassVar[int]
    EVICTED_MM_HASHES_FIELD_NUMBER: _ClassVar[int]
    STORED_MM_HASHES_FIELD_NUMBER: _ClassVar[int]
    is_snapshot: bool
    added_mm_hashes: _containers.RepeatedScalarFieldContainer[str]
    evicted_mm_hashes: _containers.RepeatedScalarFieldContainer[str]
    stored_mm_hashes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, is_snapshot: _Optional[bool] = ..., added_mm_hashes: _Optional[_Iterable[str]] = ..., evicted_mm_hashes: _Optional[_Iterable[str]] = ..., stored_mm_hashes: _Optional[_Iterable[str]] = ...) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("info", "load", "state", "heartbeat_age_ms", "num_assigned_in_flight")
    INFO_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    NUM_ASSIGNED_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    info: WorkerInfo
    load: WorkerLoad
    state: WorkerState
    heartbeat_age_ms: int
    num_assigned_in_flight: int
    def __init__(self, info: _Optional[_Union[WorkerInfo, _Mapping]] = ..., load: _Optional[_Union[WorkerLoad, _Mapping]] = ..., state: _Optional[_Union[WorkerState, str]] = ..., heartbeat_age_ms: _Optional[int] = ..., num_assigned_in_flight: _Optional[int] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker",)
    WORKER_FIELD_NUMBER: _ClassVar[int]
    worker: WorkerInfo
    def __init__(self, worker: _Optional[_Union[WorkerInfo, _Mapping]] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("lease_id", "ttl_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    ttl_ms: int
    def __init__(self, lease_id: _Optional[str] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("lease_id", "load")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    load: WorkerLoad
    def __init__(self, lease_id: _Optional[str] = ..., load: _Optional[_Union[WorkerLoad, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("ttl_ms",)
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    ttl_ms: int
    def __init__(self, ttl_ms: _Optional[int] = ...) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class DeregisterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EncodeItem(_message.Message):
    __slots__ = ("mm_hash", "num_tokens")
    MM_HASH_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    mm_hash: str
    num_tokens: int
    def __init__(self, mm_hash: _Optional[str] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class AssignEncodersRequest(_message.Message):
    __slots__ = ("request_id", "model", "items", "policy", "exclude_worker_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    items: _containers.RepeatedCompositeFieldContainer[EncodeItem]
    policy: EncoderPolicy
    exclude_worker_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., items: _Optional[_Iterable[_Union[EncodeItem, _Mapping]]] = ..., policy: _Optional[_Union[EncoderPolicy, str]] = ..., exclude_worker_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class EncoderAssignment(_message.Message):
    __slots__ = ("item_index", "worker_id", "endpoint")
    ITEM_INDEX_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    item_index: int
    worker_id: str
    endpoint: str
    def __init__(self, item_index: _Optional[int] = ..., worker_id: _Optional[str] = ..., endpoint: _Optional[str] = ...) -> None: ...

class AssignEncodersResponse(_message.Message):
    __slots__ = ("assignment_id", "policy", "assignments")
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    policy: EncoderPolicy
    assignments: _containers.RepeatedCompositeFieldContainer[EncoderAssignment]
    def __init__(self, assignment_id: _Optional[str] = ..., policy: _Optional[_Union[EncoderPolicy, str]] = ..., assignments: _Optional[_Iterable[_Union[EncoderAssignment, _Mapping]]] = ...) -> None: ...

class ItemOutcome(_message.Message):
    __slots__ = ("item_index", "latency_ms", "cache_hit", "failed")
    ITEM_INDEX_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    item_index: int
    latency_ms: float
    cache_hit: bool
    failed: bool
    def __init__(self, item_index: _Optional[int] = ..., latency_ms: _Optional[float] = ..., cache_hit: _Optional[bool] = ..., failed: _Optional[bool] = ...) -> None: ...

class CompleteEncodingRequest(_message.Message):
    __slots__ = ("assignment_id", "outcomes", "partial")
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    outcomes: _containers.RepeatedCompositeFieldContainer[ItemOutcome]
    partial: bool
    def __init__(self, assignment_id: _Optional[str] = ..., outcomes: _Optional[_Iterable[_Union[ItemOutcome, _Mapping]]] = ..., partial: _Optional[bool] = ...) -> None: ...

class CompleteEncodingResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ChoosePrefillRequest(_message.Message):
    __slots__ = ("request_id", "model", "block_hashes", "exclude_worker_ids", "roles")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    exclude_worker_ids: _containers.RepeatedScalarFieldContainer[str]
    roles: _containers.RepeatedScalarFieldContainer[WorkerRole]
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., exclude_worker_ids: _Optional[_Iterable[str]] = ..., roles: _Optional[_Iterable[_Union[WorkerRole, str]]] = ...) -> None: ...

class ChoosePrefillResponse(_message.Message):
    __slots__ = ("worker", "num_cached_blocks")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    worker: WorkerInfo
    num_cached_blocks: int
    def __init__(self, worker: _Optional[_Union[WorkerInfo, _Mapping]] = ..., num_cached_blocks: _Optional[int] = ...) -> None: ...

class ChooseDecodeRequest(_message.Message):
    __slots__ = ("request_id", "model", "exclude_worker_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    exclude_worker_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., exclude_worker_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ChooseDecodeResponse(_message.Message):
    __slots__ = ("worker",)
    WORKER_FIELD_NUMBER: _ClassVar[int]
    worker: WorkerInfo
    def __init__(self, worker: _Optional[_Union[WorkerInfo, _Mapping]] = ...) -> None: ...

class PlaceRequest(_message.Message):
    __slots__ = ("request_id", "model", "items", "policy", "block_hashes", "prefill_roles")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ROLES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    items: _containers.RepeatedCompositeFieldContainer[EncodeItem]
    policy: EncoderPolicy
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    prefill_roles: _containers.RepeatedScalarFieldContainer[WorkerRole]
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., items: _Optional[_Iterable[_Union[EncodeItem, _Mapping]]] = ..., policy: _Optional[_Union[EncoderPolicy, str]] = ..., block_hashes: _Optional[_Iterable[int]] = ..., prefill_roles: _Optional[_Iterable[_Union[WorkerRole, str]]] = ...) -> None: ...

class PlaceResponse(_message.Message):
    __slots__ = ("encoders", "prefill", "decode")
    ENCODERS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    encoders: AssignEncodersResponse
    prefill: ChoosePrefillResponse
    decode: ChooseDecodeResponse
    def __init__(self, encoders: _Optional[_Union[AssignEncodersResponse, _Mapping]] = ..., prefill: _Optional[_Union[ChoosePrefillResponse, _Mapping]] = ..., decode: _Optional[_Union[ChooseDecodeResponse, _Mapping]] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ("role", "model")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    role: WorkerRole
    model: str
    def __init__(self, role: _Optional[_Union[WorkerRole, str]] = ..., model: _Optional[str] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ...) -> None: ...

class GetEncoderDemandRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class EncoderDemand(_message.Message):
    __slots__ = ("model", "device", "num_live", "num_needed", "arrival_images_per_second", "load_encoders", "image_cost_seconds", "backlog_seconds", "cache_hit_ratio")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    NUM_LIVE_FIELD_NUMBER: _ClassVar[int]
    NUM_NEEDED_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_IMAGES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    LOAD_ENCODERS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_COST_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    model: str
    device: str
    num_live: int
    num_needed: int
    arrival_images_per_second: float
    load_encoders: float
    image_cost_seconds: float
    backlog_seconds: float
    cache_hit_ratio: float
    def __init__(self, model: _Optional[str] = ..., device: _Optional[str] = ..., num_live: _Optional[int] = ..., num_needed: _Optional[int] = ..., arrival_images_per_second: _Optional[float] = ..., load_encoders: _Optional[float] = ..., image_cost_seconds: _Optional[float] = ..., backlog_seconds: _Optional[float] = ..., cache_hit_ratio: _Optional[float] = ...) -> None: ...

class GetEncoderDemandResponse(_message.Message):
    __slots__ = ("demands", "wait_target_seconds")
    DEMANDS_FIELD_NUMBER: _ClassVar[int]
    WAIT_TARGET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    demands: _containers.RepeatedCompositeFieldContainer[EncoderDemand]
    wait_target_seconds: float
    def __init__(self, demands: _Optional[_Iterable[_Union[EncoderDemand, _Mapping]]] = ..., wait_target_seconds: _Optional[float] = ...) -> None: ...
