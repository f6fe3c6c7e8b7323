"""Streaming detokenization: token ids in, text deltas out, in time linear in the output, with
stop strings applied as vLLM's output processor applies them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers.decoders import DecodeStream

from epd.v1 import generation_pb2


class StoppedText:
    """The text of one completion as vLLM writes it (``vllm.v1.engine.detokenizer``'s
    ``FastIncrementalDetokenizer``), delta by delta.

    Each id is decoded once, with the few before it that its text depends on
    (``tokenizers.decoders.DecodeStream``), never the whole output again; characters whose bytes
    have not all arrived are held back. Special tokens are left out unless
    ``skip_special_tokens`` is false, and then two adjacent ones are written without the space
    between them when ``spaces_between_special_tokens`` is false. The text is cut before the
    stop string the engine stopped at (after it with include_stop_str_in_output); without the
    text of the stop token or EOS that ended it (unless include_stop_str_in_output); and, while
    it streams, the last characters a stop string could still begin with are held back. The
    engine has already stopped where vLLM stops: this only finds where, from the same tokens.
    """

    def __init__(self, tokenizer: Any, sampling: generation_pb2.SamplingParams) -> None:
        """``tokenizer``: a transformers tokenizer with a ``tokenizers`` backend (what
        AutoTokenizer loads for every family served); ``sampling``: the request's (its stop
        strings, include_stop_str_in_output, min_tokens and special-token options)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ValueError(f"{type(tokenizer).__name__} has no tokenizers backend to stream with")
        skip = sampling.skip_special_tokens or not sampling.HasField("skip_special_tokens")
        spaces = sampling.spaces_between_special_tokens or not sampling.HasField(
            "spaces_between_special_tokens"
        )
        self._backend = backend
        self._stream = DecodeStream(skip_special_tokens=skip)
        self._added: dict[int, str] = {}
        if not (skip or spaces):
            added = backend.get_added_tokens_decoder().items()
            self._added = {token_id: token.content for token_id, token in added}
        self._is_last_special = False
        self._stop = list(sampling.stop)
        self._include_stop = include_stop = sampling.include_stop_str_in_output
        self._min_tokens = sampling.min_tokens
        self._num_held = max(map(len, self._stop)) - 1 if self._stop and not include_stop else 0
        self._text = ""
        self._num_sent = 0
        self._num_tokens = 0
        self._checked_from = 0

    def add(self, token_ids: list[int], is_stopped: bool = False) -> str:
        """The text to send after ``token_ids``; ``is_stopped``: they end the completion with a
        stop (a stop string, a stop token id or EOS)."""
        if not is_stopped:
            self._append(token_ids)
            return self._flush(len(self._text) - self._num_held)
        self._append(token_ids[:-1])
        before_last = len(self._text)
        self._append(token_ids[-1:])
        end = self._stop_end()
        if end is None and not self._include_stop:
            end = before_last  # NOTE: a stop token id or EOS: its own text is not the answer's
        return self._flush(len(self._text) if end is None else end)

    def _append(self, token_ids: list[int]) -> None:
        for token_id in token_ids:
            part = self._stream.step(self._backend, token_id) or ""
            if self._added:
                special = self._added.get(token_id)
                if special is not None and self._is_last_special:
                    part = special  # NOTE: its own text, without the space before it
                self._is_last_special = special is not None
            self._text += part
            self._num_tokens += 1
            if self._num_tokens == self._min_tokens:
                self._checked_from = len(self._text)

    def _stop_end(self) -> int | None:
        """Where the text ends at the stop string it holds past ``min_tokens``, or None."""
        return stop_end(self._text, self._checked_from, self._stop, self._include_stop)

    def _flush(self, end: int) -> str:
        if end <= self._num_sent:
            return ""
        delta, self._num_sent = self._text[self._num_sent : end], end
        return delta


def stop_end(text: str, start: int, stop: Sequence[str], include_stop: bool) -> int | None:
    """Where ``text`` ends at a stop string that ends past ``start`` (the one that completes
    earliest, ties by ``stop``'s order): before it, or after it with ``include_stop``; None when
    none does. vLLM's ``check_stop_strings``, written here because the route runs without vLLM
    where the engines are transformers' (vLLM is an optional extra)."""
    best: tuple[int, int] | None = None  # (end of the stop string, where the text ends)
    for string in stop:
        index = text.find(string, max(start - len(string) + 1, 0))
        if index == -1:
            continue
        end = index + len(string)
        if best is None or end < best[0]:
            best = (end, end if include_stop else index)
    return None if best is None else best[1]
