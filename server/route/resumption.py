"""What a request's stream has produced so far, so that it can go on elsewhere.

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

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from epd.common.errors import Cancelled, EpdError, Unavailable
from epd.server.worker.convert import sampling_from_proto
from epd.v1 import generation_pb2

if TYPE_CHECKING:
    from epd.server.route.hops import EngineCall, Piece

DEFAULT_MAX_RESUMPTIONS = 3
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
