"""The worker role: what a worker serves, one enum for the scheduler, the route, the workers and
``epd up``.

A member's value is its number in ``epd.v1.WorkerRole`` (``Role.PREFILL`` is
``WORKER_ROLE_PREFILL``); its ``label`` (the name in lower case) is how ``epd prefill --mode``,
the metrics and ListModels spell it. Code passes ``Role`` members around and converts at the
gRPC boundary only: ``role_from_proto`` for a number read from a message (checked), ``role.value``
for one written into a message.
"""

from __future__ import annotations

import enum

from epd.common.errors import InvalidArgument
from epd.v1 import scheduler_service_pb2 as scheduler_pb


class Role(enum.Enum):
    """What a worker serves (``epd.v1.WorkerRole`` without UNSPECIFIED)."""

    ENCODE = scheduler_pb.WORKER_ROLE_ENCODE  # EncodeService: images to embeddings
    PREFILL = scheduler_pb.WORKER_ROLE_PREFILL  # PrefillService handing its KV to a decode worker
    DECODE = scheduler_pb.WORKER_ROLE_DECODE  # DecodeService
    PREFILL_DECODE = scheduler_pb.WORKER_ROLE_PREFILL_DECODE  # PrefillService, aggregated
    ENCODE_PREFILL = scheduler_pb.WORKER_ROLE_ENCODE_PREFILL  # PrefillService with the vision tower

    @property
    def label(self) -> str:
        """The role as the CLI, the metrics and ListModels spell it (``prefill_decode``)."""
        return self.name.lower()


# The roles a PrefillService serves, in the order of ``epd prefill --mode``'s choices.
PREFILL_MODES = (Role.PREFILL, Role.PREFILL_DECODE, Role.ENCODE_PREFILL)
# The roles ChoosePrefill picks from when its request names none.
DEFAULT_PREFILL_ROLES = (Role.PREFILL_DECODE, Role.PREFILL)


def hands_off_kv(role: Role, is_decode_live: bool) -> bool:
    """Whether a worker of ``role`` prefills and hands its KV to a decode worker: a prefill
    worker always, an encode_prefill worker while a decode worker is live. The route's path,
    the scheduler's ``Place`` and the route's fallback view all decide by this."""
    return role is Role.PREFILL or (role is Role.ENCODE_PREFILL and is_decode_live)


def known_role(value: int) -> Role | None:
    """The role numbered ``value`` in a message; None for UNSPECIFIED or a number this build
    does not know (a listing from a newer scheduler)."""
    try:
        return Role(value)
    except ValueError:
        return None


def role_from_proto(value: int) -> Role:
    """The role numbered ``value`` in a message; InvalidArgument (BAD_ROLE) for UNSPECIFIED or
    a number this build does not know."""
    try:
        return Role(value)
    except ValueError:
        raise InvalidArgument(
            f"worker role must be set ({_spelled(list(Role))})", reason="BAD_ROLE"
        ) from None


def _spelled(roles: list[Role]) -> str:
    labels = [role.label for role in roles]
    return f"{', '.join(labels[:-1])} or {labels[-1]}"
