"""Streaming detokenization: token ids in, text deltas out, in time linear in the output."""

from __future__ import annotations

from typing import Any

from tokenizers.decoders import DecodeStream


class Detokenizer:
    """Turns a growing stream of token ids into text deltas (special tokens skipped), holding
    back characters whose bytes have not all arrived.

    ``tokenizer`` is a transformers tokenizer with a ``tokenizers`` backend (what AutoTokenizer
    loads for every family served); each id is decoded once, with the few before it that its
    text depends on (``tokenizers.decoders.DecodeStream``), never the whole output again.
    """

    def __init__(self, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ValueError(f"{type(tokenizer).__name__} has no tokenizers backend to stream with")
        self._backend = backend
        self._stream = DecodeStream(skip_special_tokens=True)

    def add(self, token_ids: list[int]) -> str:
        """The new text after appending ``token_ids`` ('' while a character is incomplete)."""
        parts = [self._stream.step(self._backend, token_id) for token_id in token_ids]
        return "".join(part for part in parts if part)
