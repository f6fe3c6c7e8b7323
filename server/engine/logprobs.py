"""Log probabilities as vLLM 0.32's engine reports them, for engines that run their own decode
loop (the transformers engine; vLLM's engine reports its own).

The numbers are vLLM's default ``logprobs_mode``, ``raw_logprobs``: the log-softmax of the
model's logits before any restriction, bias, penalty or temperature (``v1/sample/sampler.py``).
At each position the reported token comes first with its rank (how many tokens are at least as
likely), then the ``logprobs`` most likely tokens ranked 1, 2, ... (``Sampler.gather_logprobs``);
or, where the request names ``logprob_token_ids``, those tokens in their order, ranked 1, 2, ...
(``gather_specific_token_logprobs``). A token listed twice keeps its first place and its last
entry, as in vLLM's dict of a position. Prompt token ``i`` is reported from the logits of
position ``i - 1``; the first has nothing before it (``GPUModelRunner._get_prompt_logprobs_dict``).
``-1`` asks for the whole vocabulary, as in vLLM. The candidates' texts are ``token_text``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from epd.common.errors import InvalidArgument
from epd.server.engine.base import Candidates, Sampling
from epd.server.engine.token_text import MAX_CONTEXT, TokenTexts

# vLLM's ModelConfig.max_logprobs default: the most candidates a position may ask for.
MAX_LOGPROBS = 20
# vLLM's MAX_LOGPROB_TOKEN_IDS: the most ids logprob_token_ids may name.
MAX_LOGPROB_TOKEN_IDS = 128
# Prompt positions projected to logits at once (bounds the prompt's logits in memory).
PROMPT_ROWS = 512
# One position's candidates without their texts: (token id, log probability, rank).
Ranked = tuple[tuple[int, float, int], ...]


def check_logprobs(sampling: Sampling, vocab_size: int) -> None:
    """InvalidArgument (BAD_SAMPLING, naming the field) where vLLM's ``SamplingParams``
    refuses the log probabilities ``sampling`` asks for (``_validate_logprobs``)."""
    for name in ("logprobs", "prompt_logprobs"):
        count = getattr(sampling, name)
        if count is not None and num_candidates(count, vocab_size) > MAX_LOGPROBS:
            raise _bad(
                f"Requested {name} of {num_candidates(count, vocab_size)}, which is greater "
                f"than max allowed: {MAX_LOGPROBS}",
                name,
            )
    chosen = sampling.logprob_token_ids
    if len(chosen) > MAX_LOGPROB_TOKEN_IDS:
        raise _bad(
            f"Requested logprob_token_ids of length {len(chosen)}, which is greater than max "
            f"allowed: {MAX_LOGPROB_TOKEN_IDS}",
            "logprob_token_ids",
        )
    if outside := [t for t in chosen if not 0 <= t < vocab_size]:
        raise _bad(
            f"token_id(s) {outside} in logprob_token_ids contain out-of-vocab token ids. "
            f"Vocabulary size: {vocab_size}",
            "logprob_token_ids",
        )
    if chosen and sampling.logprobs is not None and sampling.logprobs != len(chosen):
        raise _bad(
            "When both logprobs and logprob_token_ids are set, logprobs must equal "
            f"len(logprob_token_ids). Got logprobs={sampling.logprobs}, "
            f"len(logprob_token_ids)={len(chosen)}.",
            "logprob_token_ids",
        )


def num_candidates(count: int, vocab_size: int) -> int:
    """The most likely tokens ``count`` asks for (-1: the whole vocabulary)."""
    return vocab_size if count == -1 else count


def ranked(logprobs: torch.Tensor, token_ids: Sequence[int], num_top: int) -> list[Ranked]:
    """Each row of ``logprobs`` [rows, vocabulary]: its token of ``token_ids`` with its rank,
    then the ``num_top`` most likely tokens."""
    top_values, top_ids = logprobs.topk(num_top, dim=-1)
    return _listed(logprobs, token_ids, top_ids.tolist(), top_values.tolist())


def ranked_chosen(
    logprobs: torch.Tensor, token_ids: Sequence[int], chosen_ids: Sequence[int]
) -> list[Ranked]:
    """Each row of ``logprobs``: its token of ``token_ids`` with its rank, then ``chosen_ids``
    ranked by their order."""
    values = logprobs[:, list(chosen_ids)].tolist()
    return _listed(logprobs, token_ids, [list(chosen_ids)] * len(values), values)


def _listed(
    logprobs: torch.Tensor,
    token_ids: Sequence[int],
    listed_ids: list[list[int]],
    listed_values: list[list[float]],
) -> list[Ranked]:
    """Each row's token with its rank, then the row's listed tokens ranked 1, 2, ..."""
    targets = torch.tensor(list(token_ids), dtype=torch.long, device=logprobs.device)[:, None]
    own = logprobs.gather(-1, targets)
    own_values, own_ranks = own[:, 0].tolist(), (logprobs >= own).sum(-1).tolist()
    positions = []
    for row, token_id in enumerate(token_ids):
        merged = {token_id: (token_id, own_values[row], own_ranks[row])}
        for rank, (listed_id, value) in enumerate(
            zip(listed_ids[row], listed_values[row], strict=True), start=1
        ):
            merged[listed_id] = (listed_id, value, rank)
        positions.append(tuple(merged.values()))
    return positions


def raw_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """vLLM's ``Sampler.compute_logprobs``."""
    return logits.log_softmax(dim=-1, dtype=torch.float32)


def prompt_ranked(
    hidden: torch.Tensor,
    project: Callable[[torch.Tensor], torch.Tensor],
    prompt_token_ids: Sequence[int],
    num_top: int,
) -> list[Ranked]:
    """Prompt tokens 1, 2, ... ranked from ``hidden`` [positions, hidden size], the hidden
    states of the prompt's positions but its last, which ``project`` turns into logits."""
    positions: list[Ranked] = []
    for start in range(0, len(prompt_token_ids) - 1, PROMPT_ROWS):
        end = min(start + PROMPT_ROWS, len(prompt_token_ids) - 1)
        logprobs = raw_logprobs(project(hidden[start:end]))
        positions += ranked(logprobs, prompt_token_ids[start + 1 : end + 1], num_top)
    return positions


class RequestLogprobs:
    """The log probabilities one request asks for (``sampling``), position by position."""

    def __init__(self, sampling: Sampling, vocab_size: int, texts: TokenTexts) -> None:
        self.chosen_ids = sampling.logprob_token_ids
        self.num_top = (
            None if sampling.logprobs is None else num_candidates(sampling.logprobs, vocab_size)
        )
        self.num_prompt_top = (
            None
            if sampling.prompt_logprobs is None
            else num_candidates(sampling.prompt_logprobs, vocab_size)
        )
        self._texts = texts
        self._reported: list[int] = []

    @property
    def wants_samples(self) -> bool:
        """Whether each generated token is reported."""
        return self.num_top is not None or bool(self.chosen_ids)

    def sample(self, logits: torch.Tensor, token_id: int) -> Candidates:
        """The candidates of the generated ``token_id`` chosen from ``logits`` (1-D)."""
        logprobs = raw_logprobs(logits[None])
        if self.chosen_ids:
            (position,) = ranked_chosen(logprobs, [token_id], self.chosen_ids)
        else:
            assert self.num_top is not None, "a request that wants samples"
            (position,) = ranked(logprobs, [token_id], self.num_top)
        candidates = self._named(position, self._reported)
        self._reported = [*self._reported, token_id][-MAX_CONTEXT:]
        return candidates

    def prompt(self, positions: list[Ranked]) -> list[Candidates]:
        """``prompt_ranked``'s positions with their texts, after the first position's ()."""
        named: list[Candidates] = [()]
        for position in positions:
            context = [candidates[0][0] for candidates in named[-MAX_CONTEXT:] if candidates]
            named.append(self._named(position, context))
        return named

    def _named(self, position: Ranked, context: Sequence[int]) -> Candidates:
        texts = self._texts.texts([token_id for token_id, _, _ in position], context)
        return tuple(
            (token_id, logprob, rank, text)
            for (token_id, logprob, rank), text in zip(position, texts, strict=True)
        )


def _bad(message: str, param: str) -> InvalidArgument:
    return InvalidArgument(message, reason="BAD_SAMPLING", metadata={"param": param})
