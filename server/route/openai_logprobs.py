"""Log probabilities as vLLM's OpenAI server names and writes them (no I/O): the shown text of a
token (``return_tokens_as_token_ids``), the ``prompt_logprobs`` list of an answer and a chat
choice's ``logprobs`` object."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from epd.v1 import generation_pb2

# A token's shown text from its id and the text the engine decoded for it (None: none).
Namer = Callable[[int, str | None], str]
# vLLM's floor for a log probability in JSON (-inf is not JSON).
MIN_LOGPROB = -9999.0
# A number of top logprobs that shows every candidate of a position (vLLM's -1).
ALL_CANDIDATES = -1


def num_top_logprobs(sampling: generation_pb2.SamplingParams) -> int | None:
    """The top logprobs an answer shows beside each token (chat's ``top_logprobs``,
    completions' ``logprobs``) as vLLM's OpenAI server reads the request: ``ALL_CANDIDATES``
    where it names ``logprob_token_ids`` (the engine reports exactly those, and vLLM shows them
    all); None where it asked for no log probabilities."""
    if sampling.logprob_token_ids:
        return ALL_CANDIDATES
    return sampling.logprobs if sampling.HasField("logprobs") else None


def first_candidates(
    position: generation_pb2.TokenLogprobs, count: int
) -> list[generation_pb2.Logprob]:
    """The first ``count`` candidates of ``position`` (all: ``ALL_CANDIDATES``)."""
    candidates = list(position.candidates)
    return candidates if count == ALL_CANDIDATES else candidates[:count]


def token_namer(decode: Callable[[int], str], as_token_ids: bool = False) -> Namer:
    """vLLM's ``_get_decoded_token``: ``token_id:N`` with ``as_token_ids``, else the engine's text,
    else ``decode`` of the id."""
    if as_token_ids:
        return lambda token_id, text: f"token_id:{token_id}"
    return lambda token_id, text: decode(token_id) if text is None else text


def candidate_name(candidate: generation_pb2.Logprob, name: Namer) -> str:
    """The shown text of one candidate."""
    return name(candidate.token_id, candidate.token if candidate.HasField("token") else None)


def prompt_logprobs_json(
    positions: list[generation_pb2.TokenLogprobs],
) -> list[dict[str, dict[str, Any]] | None] | None:
    """An answer's ``prompt_logprobs`` as vLLM writes them: None at the prompt's first position,
    then per position each candidate's id (as a string) -> its logprob, rank and the text the
    engine decoded (None where it had none), the prompt's token first; None when none were
    asked for."""
    if not positions:
        return None
    return [_position(position) if position.candidates else None for position in positions]


def _position(position: generation_pb2.TokenLogprobs) -> dict[str, dict[str, Any]]:
    return {
        str(c.token_id): {
            "logprob": max(c.logprob, MIN_LOGPROB),
            "rank": c.rank,
            "decoded_token": c.token if c.HasField("token") else None,
        }
        for c in position.candidates
    }


def shown_candidate(
    position: generation_pb2.TokenLogprobs, token_id: int | None = None
) -> generation_pb2.Logprob:
    """The candidate of ``position`` shown as its token: ``token_id``'s (a beam's token, which
    its step lists where it ranks, as vLLM's beam search shows it), else the first (the
    generated token, as an engine lists it)."""
    if token_id is not None:
        for candidate in position.candidates:
            if candidate.token_id == token_id:
                return candidate
    return position.candidates[0]


def logprobs_json(
    positions: list[generation_pb2.TokenLogprobs],
    num_top: int,
    decode: Callable[[int], str],
    as_token_ids: bool = False,
    token_ids: Sequence[int] = (),
) -> dict[str, Any]:
    """OpenAI's chat logprobs object of ``positions`` as vLLM's OpenAI server writes it: each
    generated token (``token_ids``' where given, else each position's first candidate:
    ``shown_candidate``) with its position's ``num_top`` first candidates (vLLM's order: the
    generated token first; all of them for ``ALL_CANDIDATES``); ``decode`` names a token the
    engine sent without its text; ``as_token_ids``: each token named ``token_id:N`` (vLLM's
    return_tokens_as_token_ids)."""
    name = token_namer(decode, as_token_ids)
    shown = [*token_ids, *[None] * (len(positions) - len(token_ids))]
    return {
        "content": [
            _position_json(position, num_top, name, token_id)
            for position, token_id in zip(positions, shown, strict=False)
        ]
    }


def _position_json(
    position: generation_pb2.TokenLogprobs, num_top: int, name: Namer, token_id: int | None
) -> dict[str, Any]:
    generated = shown_candidate(position, token_id)
    entry = _candidate_json(generated, name)
    # NOTE: vLLM's bytes are the decoded text's, even as an id; none without a decoded text
    has_text = generated.HasField("token")
    entry["bytes"] = list(generated.token.encode("utf-8", errors="replace")) if has_text else None
    entry["top_logprobs"] = [_candidate_json(c, name) for c in first_candidates(position, num_top)]
    return entry


def _candidate_json(candidate: generation_pb2.Logprob, name: Namer) -> dict[str, Any]:
    token = candidate_name(candidate, name)
    return {
        "token": token,
        "logprob": max(candidate.logprob, -9999.0),
        "bytes": list(token.encode("utf-8", errors="replace")),
    }
