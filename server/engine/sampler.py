"""Next-token choice and stop conditions for engines that run their own decode loop.

vLLM does both inside its engine; the transformers engine uses these. Semantics follow vLLM's
sampler (``vllm/v1/sample/sampler.py``), in its order: the logits are restricted to
``allowed_token_ids``, ``bad_words`` are banned, the end-of-sequence and stop token ids are
banned until ``min_tokens`` tokens were generated, ``logit_bias`` is added, then the repetition
penalty (tokens of the prompt and of the output), the frequency and presence penalties (tokens of
the output) apply. Temperature 0 then takes the argmax; otherwise the logits are divided by the
temperature, and ``min_p``, top-k then top-p filter the distribution a seeded generator draws
from. The steps are transformers' logits processors where one means what vLLM's step means.

A stop token id, an end-of-sequence id (unless ``ignore_eos``) or a stop string in the decoded
completion ends the request with ``stop``, the token that ended it included; a stop string
counts only once it ends after the text of the first ``min_tokens`` tokens.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence

import torch
from transformers.generation.logits_process import (
    LogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from epd.common.errors import InvalidArgument
from epd.server.engine.base import Sampling

# The fields of ``Sampling`` beyond the basics these implement, as vLLM means them (the log
# probabilities in ``logprobs.py``); an engine using them refuses the others (a structured output
# needs a grammar engine in the decode loop). ``include_stop_str_in_output`` changes the text vLLM
# makes of the tokens, never the tokens.
IMPLEMENTED_FIELDS = (
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "min_tokens",
    "logit_bias",
    "bad_words",
    "allowed_token_ids",
    "include_stop_str_in_output",
    "logprobs",
    "prompt_logprobs",
    "logprob_token_ids",
)
# A logits processor and whether it reads the prompt's tokens too (else the output's only).
Step = tuple[LogitsProcessor, bool]


class OutputPenalties(LogitsProcessor):
    """OpenAI's frequency and presence penalties as vLLM applies them: each token's logit less
    ``frequency`` times its count in the output, less ``presence`` if it occurs there at all."""

    def __init__(self, frequency: float, presence: float) -> None:
        self.frequency = frequency
        self.presence = presence

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        vocab_size = scores.shape[-1]
        counts = torch.bincount(input_ids[0], minlength=vocab_size)[:vocab_size].to(scores.dtype)
        penalised = scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)
        return penalised  # type: ignore[return-value]


class TokenSampler:
    """Chooses each next token of one request from its logits."""

    def __init__(
        self,
        sampling: Sampling,
        prompt_token_ids: Sequence[int] = (),
        *,
        eos_token_ids: Iterable[int] = (),
        bad_words_ids: Sequence[Sequence[int]] = (),
    ) -> None:
        """``prompt_token_ids``: the prompt as the model reads it (images expanded), for the
        repetition penalty; ``eos_token_ids``: every end-of-sequence id of the model, which
        ``min_tokens`` holds off even under ``ignore_eos`` (as vLLM does); ``bad_words_ids``:
        ``sampling.bad_words`` as token ids (``bad_words_token_ids``)."""
        self.sampling = sampling
        self._prompt = torch.tensor(list(prompt_token_ids), dtype=torch.long)
        self._steps = logits_steps(sampling, set(eos_token_ids), bad_words_ids)
        self._min_p = MinPLogitsWarper(sampling.min_p) if sampling.min_p > 0 else None
        self._generator: torch.Generator | None = None
        if sampling.temperature > 0:
            seed = sampling.seed if sampling.seed is not None else random.getrandbits(63)
            self._generator = torch.Generator().manual_seed(seed)

    def select(self, logits: torch.Tensor, output_token_ids: Sequence[int] = ()) -> int:
        """The next token id given the last position's ``logits`` (1-D, vocabulary-sized) and
        the tokens generated before it."""
        scores = self.shape(logits, output_token_ids)
        if self._generator is None:
            return int(scores.argmax())
        scores = scores / self.sampling.temperature
        if self._min_p is not None:
            scores = self._min_p(None, scores[None])[0]  # type: ignore[arg-type]
        probs = filter_probabilities(scores, self.sampling.top_k, self.sampling.top_p)
        return int(torch.multinomial(probs.cpu(), 1, generator=self._generator))

    def shape(self, logits: torch.Tensor, output_token_ids: Sequence[int] = ()) -> torch.Tensor:
        """``logits`` (float) after every step before the temperature's."""
        scores = logits.float()[None]
        if not self._steps:
            return scores[0]
        scores = scores.cpu()  # NOTE: some processors keep their token ids on the CPU
        output = torch.tensor([list(output_token_ids)], dtype=torch.long)
        whole = torch.cat([self._prompt[None], output], dim=1)
        for processor, reads_prompt in self._steps:
            scores = processor(whole if reads_prompt else output, scores)
        return scores[0]


def logits_steps(
    sampling: Sampling, eos_token_ids: set[int], bad_words_ids: Sequence[Sequence[int]]
) -> list[Step]:
    """The processors ``sampling`` asks for before the temperature, in vLLM's order."""
    steps: list[Step] = []
    if sampling.allowed_token_ids:
        allowed = list(sampling.allowed_token_ids)
        steps.append((PrefixConstrainedLogitsProcessor(lambda _, __: allowed, num_beams=1), False))
    if bad_words_ids:
        steps.append((NoBadWordsLogitsProcessor([list(ids) for ids in bad_words_ids]), False))
    held_off = sorted(eos_token_ids | set(sampling.stop_token_ids))
    if sampling.min_tokens > 0 and held_off:
        minimum = MinNewTokensLengthLogitsProcessor(0, sampling.min_tokens, held_off)
        steps.append((minimum, False))
    if sampling.logit_bias:
        biases = {(token_id,): float(bias) for token_id, bias in sampling.logit_bias}
        steps.append((SequenceBiasLogitsProcessor(biases), False))  # type: ignore[arg-type]
    if sampling.repetition_penalty != 1.0:
        penalty = float(sampling.repetition_penalty)
        steps.append((RepetitionPenaltyLogitsProcessor(penalty), True))
    if sampling.frequency_penalty or sampling.presence_penalty:
        penalties = OutputPenalties(sampling.frequency_penalty, sampling.presence_penalty)
        steps.append((penalties, False))
    return steps


def bad_words_token_ids(
    words: Iterable[str], encode: Callable[[str], list[int]]
) -> list[list[int]]:
    """``words`` as the token sequences vLLM bans (``SamplingParams.update_from_tokenizer``):
    each word without leading spaces, and with one leading space where that spelling starts with
    another token and has as many; ``encode``: text -> token ids, no special tokens.
    InvalidArgument when a word is no tokens at all."""
    sequences: list[list[int]] = []
    for word in words:
        bare = encode(word.lstrip())
        if not bare:
            raise _bad("bad_words entries must tokenize to at least one token", "bad_words")
        sequences.append(bare)
        spaced = encode(" " + word.lstrip())
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            sequences.append(spaced)
    return sequences


def check_token_ids(
    sampling: Sampling, vocab_size: int, bad_words_ids: Sequence[Sequence[int]] = ()
) -> None:
    """InvalidArgument naming the first field of ``sampling`` holding a token id the model's
    logits (``vocab_size`` wide) do not have, as vLLM refuses them."""
    fields = {
        "allowed_token_ids": list(sampling.allowed_token_ids),
        "logit_bias": [token_id for token_id, _ in sampling.logit_bias],
        "bad_words": [token_id for ids in bad_words_ids for token_id in ids],
    }
    for name, token_ids in fields.items():
        if outside := [t for t in token_ids if not 0 <= t < vocab_size]:
            raise _bad(
                f"token ids {outside} in {name} are out of the vocabulary (size {vocab_size})",
                name,
            )


def _bad(message: str, param: str) -> InvalidArgument:
    return InvalidArgument(message, reason="BAD_SAMPLING", metadata={"param": param})


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
        self._min_tokens = sampling.min_tokens
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
        if not self._stop_strings or len(token_ids) < self._min_tokens:
            return False
        text = self._decode(token_ids)
        # NOTE: a match must end in text the newest token added, past the first min_tokens'.
        searched_to, self._text_length = self._text_length, len(text)
        if len(token_ids) == self._min_tokens:
            return False
        return any(text.find(s, max(searched_to + 1 - len(s), 0)) != -1 for s in self._stop_strings)
