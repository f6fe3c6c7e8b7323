"""The text of each log probability candidate as vLLM 0.32's engine writes it, for engines that
report their own log probabilities (vLLM's engine writes its own).

vLLM decodes each candidate alone (``convert_ids_list_to_tokens``): ``decode([id])``, with the
leading spaces a SentencePiece (Metaspace) piece stands for restored; a text ending in the
replacement character (a byte-fallback token cutting a UTF-8 character) is decoded again after
up to four of the tokens reported before it at the earlier positions, its text being what it adds
to theirs ("" while the character is still incomplete): ``LogprobsProcessor._verify_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

REPLACEMENT = "\ufffd"
# Tokens before a candidate that can complete its UTF-8 character (vLLM's max_context).
MAX_CONTEXT = 4


class TokenTexts:
    """Candidates' texts from one tokenizer (transformers')."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.marker = leading_space_marker(tokenizer)

    def texts(self, token_ids: Sequence[int], context: Sequence[int] = ()) -> list[str]:
        """The texts of ``token_ids``, candidates at one position; ``context``: the tokens
        reported at the positions before it, oldest first."""
        texts = [self._alone(token_id) for token_id in token_ids]
        return [
            self._completed(token_id, context) if text.endswith(REPLACEMENT) else text
            for token_id, text in zip(token_ids, texts, strict=True)
        ]

    def _alone(self, token_id: int) -> str:
        text = self.tokenizer.decode([token_id]) or ""
        if self.marker is None:
            return str(text)
        raw = self.tokenizer.convert_ids_to_tokens([token_id])[0] or ""
        num_markers = len(raw) - len(raw.lstrip(self.marker))
        missing = num_markers - (len(text) - len(text.lstrip(" ")))
        return " " * missing + text if missing > 0 else str(text)

    def _completed(self, token_id: int, context: Sequence[int]) -> str:
        """vLLM's ``_correct_decoded_token``: what ``token_id`` adds to the shortest tail of
        ``context`` with which it decodes to whole characters; "" when none does."""
        decode = self.tokenizer.decode
        context = list(context)[-MAX_CONTEXT:]
        for num_context in range(1, len(context) + 1):
            tail = context[-num_context:]
            whole = str(decode([*tail, token_id]))
            if whole.endswith(REPLACEMENT):
                continue
            clean_end = len(tail)
            while clean_end > 0 and str(decode([tail[clean_end - 1]])).endswith(REPLACEMENT):
                clean_end -= 1
            prefix = str(decode(tail[:clean_end])) if clean_end > 0 else ""
            if whole.startswith(prefix):
                return whole[len(prefix) :]
            common = 0
            for a, b in zip(prefix, whole, strict=False):
                if a != b:
                    break
                common += 1
            return whole[common:]
        return ""


def leading_space_marker(tokenizer: Any) -> str | None:
    """The Metaspace replacement character of ``tokenizer``'s pre-tokenizer (SentencePiece's
    "▁"), whose leading copies ``decode`` drops from a lone token; None for other
    pre-tokenizers (vLLM's ``get_leading_space_marker``)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        config = json.loads(backend.to_str())
    except (ValueError, TypeError):
        return None
    pre = config.get("pre_tokenizer") or {}
    candidates = [pre] if pre.get("type") != "Sequence" else pre.get("pretokenizers", [])
    for step in candidates:
        if step.get("type") == "Metaspace":
            return str(step.get("replacement", "\u2581"))
    return None
