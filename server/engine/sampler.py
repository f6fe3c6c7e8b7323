"""Next-token choice and stop conditions for engines that run their own decode loop.

vLLM does both inside its engine; the transformers engine uses these. Semantics follow vLLM's:
temperature 0 is greedy, top-k then top-p filter the distribution, a seed makes sampling
repeatable; a stop token id, an end-of-sequence id (unless ``ignore_eos``) or a stop string in
the decoded completion ends the request with ``stop``, the token that ended it included.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import torch

from epd.server.engine.base import Sampling


class TokenSampler:
    """Chooses each next token of one request from its logits."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self._generator: torch.Generator | None = None
        if sampling.temperature > 0:
            seed = sampling.seed if sampling.seed is not None else random.getrandbits(63)
            self._generator = torch.Generator().manual_seed(seed)

    def select(self, logits: torch.Tensor) -> int:
        """The next token id given the last position's ``logits`` (1-D, vocabulary-sized)."""
        logits = logits.float()
        if self._generator is None:
            return int(logits.argmax())
        probs = filter_probabilities(
            logits / self.sampling.temperature, self.sampling.top_k, self.sampling.top_p
        )
        return int(torch.multinomial(probs.cpu(), 1, generator=self._generator))


def filter_probabilities(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Softmax of ``logits`` keeping the ``top_k`` most likely tokens (0: all), then the
    smallest most-likely set whose probability reaches ``top_p``; renormalised."""
    if 0 < top_k < logits.numel():
        threshold = logits.topk(top_k).values[-1]
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    probs = logits.softmax(-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return probs / probs.sum()


class StopChecker:
    """Decides after each token whether a request is finished, and why."""

    def __init__(
        self,
        sampling: Sampling,
        eos_token_ids: Iterable[int],
        decode: Callable[[list[int]], str],
        max_new_tokens: int,
    ) -> None:
        """``decode``: token ids -> text (for stop strings); ``max_new_tokens``: the request's
        token budget after clamping to the engine's length limit."""
        self._stop_ids = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            self._stop_ids.update(eos_token_ids)
        self._stop_strings = tuple(s for s in sampling.stop if s)
        self._decode = decode
        self._max_new_tokens = max_new_tokens
        self._text_length = 0

    def check(self, token_ids: list[int]) -> str | None:
        """``stop``, ``length`` or None (go on) after ``token_ids`` (all generated so far)."""
        if token_ids[-1] in self._stop_ids or self._ends_with_stop_string(token_ids):
            return "stop"
        if len(token_ids) >= self._max_new_tokens:
            return "length"
        return None

    def _ends_with_stop_string(self, token_ids: list[int]) -> bool:
        if not self._stop_strings:
            return False
        text = self._decode(token_ids)
        longest = max(len(s) for s in self._stop_strings)
        # NOTE: only text the newest token may have completed is searched.
        start = max(self._text_length - longest + 1, 0)
        self._text_length = len(text)
        return any(s in text[start:] for s in self._stop_strings)
