"""A text's token ids as ``tokenizer(text)["input_ids"]`` gives them (no grpc).

transformers' call wraps its Rust tokenizer in several layers of Python per call (argument
merging, truncation and padding set-up, a batch of one, a ``BatchEncoding``), which cost more
than the Rust work itself for a chat's few dozen tokens. Where that wrapper adds nothing to the
ids (a fast tokenizer whose class keeps transformers' call, with no truncation, padding or
special-token splitting in force), the Rust tokenizer is called directly; otherwise, and for
slow tokenizers, the call goes through transformers.
"""

from __future__ import annotations

from typing import Any


def text_token_ids(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    """``tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]``: from its Rust
    tokenizer when its class calls that as transformers' fast tokenizers do (none of the call,
    its encoding or its input mode overridden) and no truncation, padding or special-token
    splitting is in force (state an earlier call may leave behind), else through the call."""
    import tokenizers
    from transformers import TokenizersBackend

    kind = type(tokenizer)
    backend: Any = getattr(tokenizer, "_tokenizer", None)
    is_direct = (
        isinstance(tokenizer, TokenizersBackend)
        and isinstance(backend, tokenizers.Tokenizer)
        and kind.__call__ is TokenizersBackend.__call__
        and kind._encode_plus is TokenizersBackend._encode_plus
        and getattr(kind, "_switch_to_input_mode", None)
        is getattr(TokenizersBackend, "_switch_to_input_mode", None)
        and backend.truncation is None
        and backend.padding is None
        and backend.encode_special_tokens == bool(tokenizer.split_special_tokens)
    )
    if is_direct:
        return list(backend.encode(text, add_special_tokens=add_special_tokens).ids)
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
