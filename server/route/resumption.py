"""Where a request's stream stands between attempts, so that it can go on elsewhere: what it
sent (``Progress``), the attempt that failed (``Attempt``), and the retries and resumptions so far
with their two transitions (``Recovery``). ``hops.stream_tokens`` is the loop that uses them.

A failure before the first token is retried on another prefill worker, up to
``MAX_PREFILL_ATTEMPTS`` workers.

When the worker streaming a request's tokens dies mid-stream, the route continues the request on
another replica: the same prompt (its images re-read or re-encoded) followed by the tokens the
client already has, asking only for the tokens still due. The client sees one stream. Greedy
requests give the uninterrupted run's tokens, since the model sees the same sequence. A seeded
sampling request restarts its engine's generator on the new worker, so its continuation is a
sample from the right distribution but not the one the interrupted worker would have drawn. Stop
strings are matched by the engine in the text it generates, so one that would straddle the
resumption point is not seen.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from epd.common.errors import Cancelled, EpdError, Unavailable
from epd.server.engine.base import KV_LOAD_FAILED
from epd.server.worker.convert import sampling_from_proto
from epd.v1 import generation_pb2
from epd.v1 import scheduler_service_pb2 as scheduler_pb

if TYPE_CHECKING:
    from epd.server.route.hops import EngineCall, Piece

logger = logging.getLogger(__name__)
DEFAULT_MAX_RESUMPTIONS = 3
MAX_PREFILL_ATTEMPTS = 3
RESUMED_EVENT = "epd.resumed"
# told of each resumption: the failed worker's role ("prefill" or "decode"), tokens sent before
OnResumed = Callable[[str, int], None]
# failures a resumption answers: the worker is gone or its server ended the call
RESUMABLE = (Unavailable, Cancelled)
NO_WORKER_REASONS = frozenset({"NO_PREFILL_WORKER", "NO_DECODE_WORKER"})


def is_resumable(error: EpdError) -> bool:
    """Whether ``error`` from an engine hop means its worker is gone, not that the request is
    wrong."""
    return isinstance(error, RESUMABLE)


def is_no_worker(error: EpdError) -> bool:
    """Whether ``error`` is the scheduler's (or the route's own view's) answer that no worker of a
    role is live: nobody to resume on."""
    return error.reason in NO_WORKER_REASONS


@dataclass
class Progress:
    """The tokens of one request sent to its client so far, and whether its last piece went."""

    call: EngineCall
    sent: list[int] = field(default_factory=list)
    is_finished: bool = False
    # tokens already sent when the current attempt started (its engine counts them as prompt)
    offset: int = 0
    num_resumed: int = 0

    @property
    def can_resume(self) -> bool:
        """Whether a new attempt can continue the tokens sent as its prompt and still answer as
        the uninterrupted request would: not when a grammar constrains the output (it would
        start again mid-answer), penalties or the repetition stop count the output's tokens
        (they would count them as prompt), or a thinking budget counts the reasoning (its count
        over reasoning turned prompt is not shown equal to the uninterrupted one's)."""
        sampling = self.call.sampling
        return not (
            sampling.HasField("structured_output")
            or sampling.presence_penalty
            or sampling.frequency_penalty
            or sampling.HasField("repetition_detection")
            or sampling.HasField("thinking_token_budget")
        )

    @property
    def max_tokens(self) -> int:
        """The request's token budget, with the engines' default for 0."""
        return sampling_from_proto(self.call.sampling).max_tokens

    @property
    def remaining(self) -> int:
        """Tokens still due."""
        return max(self.max_tokens - len(self.sent), 0)

    def continued(self, prompt: generation_pb2.Prompt) -> EngineCall:
        """The call for the next attempt: ``prompt`` followed by the tokens already sent, with
        the budget left, under a request id of its own (``-resumed-N``: an engine may still hold
        the interrupted one)."""
        self.offset = len(self.sent)
        if not self.sent:
            return replace(self.call, prompt=prompt)
        self.num_resumed += 1
        extended = generation_pb2.Prompt()
        extended.CopyFrom(prompt)
        extended.token_ids.extend(self.sent)
        sampling = generation_pb2.SamplingParams()
        sampling.CopyFrom(self.call.sampling)
        sampling.max_tokens = self.remaining
        sampling.min_tokens = max(sampling.min_tokens - len(self.sent), 0)
        sampling.ClearField("prompt_logprobs")  # NOTE: sent with the first piece already
        request_id = f"{self.call.request_id}-resumed-{self.num_resumed}"
        return replace(self.call, request_id=request_id, prompt=extended, sampling=sampling)

    def record(self, piece: Piece) -> Piece:
        """Note ``piece`` as sent; its usage counted as the uninterrupted request's."""
        self.sent.extend(piece.token_ids)
        self.is_finished = self.is_finished or bool(piece.finish_reason)
        if piece.usage is None or not self.offset:
            return piece
        usage = generation_pb2.Usage()
        usage.CopyFrom(piece.usage)
        usage.prompt_tokens = max(usage.prompt_tokens - self.offset, 0)
        usage.completion_tokens += self.offset
        usage.cached_prompt_tokens = min(usage.cached_prompt_tokens, usage.prompt_tokens)
        return replace(piece, usage=usage)


@dataclass
class Attempt:
    """One attempt at a request: its workers, where it failed, its release of the embeddings."""

    prefill: scheduler_pb.WorkerInfo | None = None
    decode_id: str = ""
    # the decode worker's stream had started when the attempt failed
    in_decode: bool = False
    release: asyncio.Future[Any] | None = None

    def failed_role(self, error: EpdError) -> str:
        """The role of the worker whose failure, ``error``, ended the attempt: a decode stream
        that could not read its KV failed for want of the prefill worker."""
        return "decode" if self.in_decode and error.reason != KV_LOAD_FAILED else "prefill"


@dataclass
class Excluded:
    """Workers that failed this request, not chosen again for it."""

    prefill: list[str] = field(default_factory=list)
    decode: list[str] = field(default_factory=list)

    def add(self, attempt: Attempt, error: EpdError) -> str:
        """Exclude the worker whose ``error`` failed ``attempt``; returns its id."""
        if attempt.failed_role(error) == "decode":
            self.decode.append(attempt.decode_id)
            return attempt.decode_id
        assert attempt.prefill is not None
        self.prefill.append(attempt.prefill.id)
        return attempt.prefill.id


@dataclass
class Recovery:
    """Where one request's stream stands between attempts: what it sent, the workers it excluded,
    its failures and resumptions so far, the failure being recovered from. The transitions:
    ``check_recoverable`` (raise what ends the request), then ``recover_from`` (exclude the
    failed worker and count the failure)."""

    progress: Progress
    max_resumptions: int
    excluded: Excluded = field(default_factory=Excluded)
    num_failures: int = 0
    num_resumptions: int = 0
    lost: EpdError | None = None

    @property
    def is_resuming(self) -> bool:
        """Whether the client has tokens already: the next attempt continues after them."""
        return bool(self.progress.sent)

    def check_recoverable(self, attempt: Attempt, error: EpdError) -> None:
        """Raise what ends the request after ``attempt`` failed with ``error``: the loss being
        resumed from when no replica is left to resume on, else ``error`` itself when it is not
        a worker's loss (or no worker was reached) or the tries are spent."""
        lost = self.lost if self.is_resuming else None
        if lost is not None and (attempt.prefill is None or is_no_worker(error)):
            raise lost from error
        if attempt.prefill is None or not is_resumable(error) or self._tries_spent():
            raise error
        if self.is_resuming and not self.progress.can_resume:
            raise error

    def recover_from(self, attempt: Attempt, error: EpdError, on_resumed: OnResumed | None) -> None:
        """Exclude the worker whose ``error`` failed ``attempt`` and count the failure (a
        resumption when tokens were sent: a span event, and ``on_resumed`` told)."""
        self.lost = error
        failed = self.excluded.add(attempt, error)
        self.num_failures += 1
        self.num_resumptions += self.is_resuming
        num_sent = len(self.progress.sent)
        _log_failure(self.progress.call.request_id, attempt, failed, error, num_sent)
        if not self.is_resuming:
            return
        trace.get_current_span().add_event(
            RESUMED_EVENT, {"epd.failed_worker": failed, "epd.tokens_sent": num_sent}
        )
        if on_resumed is not None:
            on_resumed(attempt.failed_role(error), num_sent)

    def _tries_spent(self) -> bool:
        if self.is_resuming:
            return self.num_resumptions >= self.max_resumptions
        return self.num_failures + 1 >= MAX_PREFILL_ATTEMPTS


def _log_failure(
    request_id: str, attempt: Attempt, failed: str, error: EpdError, sent: int
) -> None:
    if sent:
        logger.warning(
            "request %s: %s worker %s failed after %d tokens (%s); resuming on another",
            request_id,
            attempt.failed_role(error),
            failed,
            sent,
            error,
        )
    else:
        logger.warning(
            "request %s: prefill on %s failed before the first token (%s); retrying elsewhere",
            request_id,
            failed,
            error,
        )
