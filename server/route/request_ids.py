"""Request ids: the caller's, or one made up here, the one place the route defaults them."""

from __future__ import annotations

import uuid

from epd.v1 import route_service_pb2


def ensure_request_id(request: route_service_pb2.GenerateRequest) -> str:
    """``request``'s id, made up and set on it when the caller sent none."""
    if not request.request_id:
        request.request_id = uuid.uuid4().hex
    return request.request_id
