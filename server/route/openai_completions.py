"""OpenAI completions JSON <-> epd (no I/O): ``/v1/completions`` as ``vllm serve`` answers it.

A body is parsed by vLLM's own ``CompletionRequest`` (its types, ranges, defaults: 16 tokens);
its prompts, texts or token ids, one or a list, go to the engines as they are, with no chat
template and no image. Prompt ``i``'s ``n`` completions are choices ``i * n`` to ``i * n + n - 1``
(vLLM's numbering), each a request of its own (``choices.child_requests``). ``echo`` repeats each
prompt's text before its answer (with ``logprobs``, the prompt's tokens and log probabilities
too, from the prefill worker; with ``max_tokens`` 0, the prompt alone), ``prompt_logprobs`` are
each choice's, and ``return_tokens_as_token_ids`` names logprob tokens ``token_id:N``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from epd.common.generation import finish_reason_name
from epd.server.route.openai_answers import Answer, envelope, total_usage, usage_json
from epd.server.route.openai_logprobs import (
    ALL_CANDIDATES,
    MIN_LOGPROB,
    Namer,
    candidate_name,
    first_candidates,
    num_top_logprobs,
    prompt_logprobs_json,
    shown_candidate,
    token_namer,
)
from epd.server.route.openai_schema import (
    SAMPLING_FIELDS,
    answer_bound,
    kept_tokens,
    parse_with,
    refuse_unimplemented,
    take_beam_search,
    vllm_sampling,
)
from epd.server.route.prompt import TRUNCATION_SIDE
from epd.server.route.request import ChatRequest, bad, new_request_id
from epd.server.route.request_check import (
    MAX_CHOICES,
    RequestLimits,
    check_content,
    check_request_id,
)
from epd.v1 import generation_pb2

# vLLM's CompletionRequest fields epd implements.
IMPLEMENTED_FIELDS = SAMPLING_FIELDS | {
    "prompt",
    "echo",
    "add_special_tokens",
    "return_token_ids",
    "truncate_prompt_tokens",
    "truncation_side",
}

# vLLM's refusal of a streamed beam search on /v1/completions (its chat streams one).
STREAMED_BEAMS = "Streaming is not currently supported with beam search"


@dataclass(frozen=True, slots=True)
class CompletionPrompt:
    """A completion request's prompts: each one's token ids (as the engine gets them, cut to
    ``truncate_prompt_tokens``), and each one's text when ``echo`` repeats it (None: no echo;
    as vLLM's, the whole text though the prompt was cut, and '' with ``return_token_ids``)."""

    token_ids: list[list[int]]
    echo: list[str] | None = None
    # echo with max_tokens 0: each answer is its prompt alone (vLLM still samples one token)
    is_echo_only: bool = False


def to_completion_request(
    body: Any,
    default_model: str,
    tokenizer: Any,
    request_id: str | None = None,
    limits: RequestLimits | None = None,
    defaults: dict[str, Any] | None = None,
) -> tuple[ChatRequest, CompletionPrompt]:
    """Check a completions body whole, as vLLM's OpenAI server does, and convert it;
    ``tokenizer`` tokenises a text prompt as vLLM's renderer does."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    if request_id is not None:
        check_request_id(request_id, "X-Request-Id")
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object", "body")
    parsed = parse_with(CompletionRequest, body)
    refuse_unimplemented(parsed, IMPLEMENTED_FIELDS)
    if parsed.stream and parsed.use_beam_search:
        raise bad(STREAMED_BEAMS, "stream")
    limits = limits or RequestLimits()
    context = limits.max_context_tokens
    keep = None if parsed.truncate_prompt_tokens is None else kept_tokens(parsed, context)
    prompt = _prompts(parsed, tokenizer, keep)
    max_tokens = answer_bound(parsed, context)
    if len(prompt.token_ids) * max(parsed.n, 1) > MAX_CHOICES:
        raise bad(
            f"a request answers at most {MAX_CHOICES} completions (prompts times n)",
            "prompt",
            "LIMIT_EXCEEDED",
        )
    first, *others = prompt.token_ids
    request = ChatRequest(
        new_request_id(request_id),
        parsed.model or default_model,
        [],
        vllm_sampling(parsed, max_tokens, defaults or {}),
        prompt_token_ids=first,
        more_prompts=others,
        tokens_as_ids=bool(parsed.return_tokens_as_token_ids),
        return_token_ids=bool(parsed.return_token_ids),
        stream_interval=parsed.stream_interval or 1,
    )
    if parsed.use_beam_search:
        take_beam_search(parsed, request)
    for token_ids in prompt.token_ids:
        check_content(replace(request, prompt_token_ids=token_ids), limits)
    return request, prompt


def _prompts(parsed: Any, tokenizer: Any, keep: int | None) -> CompletionPrompt:
    prompt = parsed.prompt
    is_one = isinstance(prompt, str) or (bool(prompt) and isinstance(prompt[0], int))
    prompts = [prompt] if is_one else list(prompt or [])
    if not prompts:
        raise bad("the prompt is empty", "prompt")
    whole = [_token_ids(one, parsed, tokenizer) for one in prompts]
    token_ids = [_truncated(ids, keep, parsed.truncation_side) for ids in whole]
    if not parsed.echo:
        return CompletionPrompt(token_ids)
    texts = [
        "" if parsed.return_token_ids else one if isinstance(one, str) else tokenizer.decode(ids)
        for one, ids in zip(prompts, whole, strict=True)
    ]
    return CompletionPrompt(token_ids, texts, parsed.max_tokens == 0)


def _truncated(token_ids: list[int], keep: int | None, side: str | None) -> list[int]:
    """vLLM's ``truncate_prompt_tokens`` on a completion's prompt: its last ``keep`` tokens
    (``side`` right: its first; None: no cut)."""
    if keep is None or keep >= len(token_ids):
        return token_ids
    is_left = (side or TRUNCATION_SIDE) == "left"
    return token_ids[len(token_ids) - keep :] if is_left else token_ids[:keep]


def _token_ids(prompt: str | list[int], parsed: Any, tokenizer: Any) -> list[int]:
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=parsed.add_special_tokens)["input_ids"])
    ids = [int(token) for token in prompt]
    if not ids:
        raise bad("the prompt is empty", "prompt")
    if not all(0 <= token < len(tokenizer) for token in ids):
        raise bad(f"the prompt holds token ids outside [0, {len(tokenizer)})", "prompt")
    return ids


@dataclass(slots=True)
class CompletionWriter:
    """Writes the answers of one completions request as vLLM does: each choice's echo, text,
    logprobs, prompt logprobs and token ids, whole or streamed, and the usage of all its
    prompts."""

    request: ChatRequest
    prompt: CompletionPrompt
    decode: Callable[[int], str]
    # prompt tokens of each prompt, as its first choice's usage reported them
    num_prompt_tokens: dict[int, int] = field(default_factory=dict)
    # each streamed choice's next logprobs text offset: after the tokens it reported, as vLLM
    # counts it (their shown lengths, not its text's, which a stop string may hold back)
    next_offsets: dict[int, int] = field(default_factory=dict)

    @property
    def num_per_prompt(self) -> int:
        """Choices per prompt (``n``)."""
        return max(self.request.sampling.n, 1)

    def whole(self, answers: list[Answer]) -> dict[str, Any]:
        """The non-streamed text_completion object."""
        choices = []
        for index, answer in enumerate(answers):
            prompt_positions = answer.prompt_positions
            text = "".join(answer.texts)
            choice = self._choice(index, text, answer.positions, prompt_positions, answer.token_ids)
            choice["finish_reason"] = finish_reason_name(answer.finish) or "stop"
            choice["prompt_logprobs"] = prompt_logprobs_json(prompt_positions)
            if self.request.return_token_ids:
                choice["prompt_token_ids"] = self._prompt_ids(index)
                choice["token_ids"] = list(answer.token_ids)
            choices.append(choice)
        body = envelope(
            f"cmpl-{self.request.request_id}", "text_completion", self.request.model, choices
        )
        return {**body, "usage": usage_json(self._usage(answers))}

    def delta(self, index: int, chunk: Any, so_far: Answer) -> dict[str, Any]:
        """The streamed text_completion of choice ``index``'s ``chunk`` (a ``RouteChunk``),
        ``so_far`` its answer before it."""
        if chunk.usage is not None and index % self.num_per_prompt == 0:
            self.num_prompt_tokens[index] = chunk.usage.prompt_tokens
        if not so_far.texts:
            choice = self._choice(
                index, chunk.text, chunk.logprobs, chunk.prompt_logprobs, list(chunk.token_ids)
            )
            if self.request.return_token_ids:  # NOTE: as vLLM: on each choice's first chunk
                choice["prompt_token_ids"] = self._prompt_ids(index)
        elif self.prompt.is_echo_only:
            choice = {"index": index, "text": "", "logprobs": None}
        else:
            offset = self.next_offsets.get(index, 0)
            logprobs = self._logprobs(chunk.logprobs, offset, list(chunk.token_ids))
            choice = {"index": index, "text": chunk.text, "logprobs": logprobs}
        if choice["logprobs"] and choice["logprobs"]["tokens"]:
            shown = choice["logprobs"]
            self.next_offsets[index] = shown["text_offset"][-1] + len(shown["tokens"][-1])
        choice["finish_reason"] = finish_reason_name(chunk.finish_reason)
        if self.request.return_token_ids:
            choice["token_ids"] = list(chunk.token_ids)
        request = self.request
        return envelope(f"cmpl-{request.request_id}", "text_completion", request.model, [choice])

    def usage(self, usage: generation_pb2.Usage | None) -> dict[str, Any]:
        """The stream's usage chunk: ``usage`` with every prompt's tokens counted."""
        if usage is not None and len(self.num_prompt_tokens) > 1:
            usage = generation_pb2.Usage(
                prompt_tokens=sum(self.num_prompt_tokens.values()),
                completion_tokens=usage.completion_tokens,
                cached_prompt_tokens=usage.cached_prompt_tokens,
            )
        return completion_chunk(self.request.request_id, self.request.model, "", 0, usage=usage)

    def _choice(
        self,
        index: int,
        text: str,
        positions: list[generation_pb2.TokenLogprobs],
        prompt_positions: list[generation_pb2.TokenLogprobs],
        token_ids: list[int],
    ) -> dict[str, Any]:
        echoes = self.prompt.echo
        echo = echoes[index // self.num_per_prompt] if echoes is not None else ""
        if self.prompt.is_echo_only:
            text, positions = "", []
        if echoes is not None and num_top_logprobs(self.request.sampling) is not None:
            prompt_ids = self._prompt_ids(index)
            shown = [*prompt_positions, *positions]
            logprobs = self._logprobs(shown, 0, [*prompt_ids, *token_ids])
        else:
            logprobs = self._logprobs(positions, 0, token_ids)
        return {"index": index, "text": echo + text, "logprobs": logprobs}

    def _prompt_ids(self, index: int) -> list[int]:
        """The token ids of choice ``index``'s prompt, as the engine got them."""
        return self.prompt.token_ids[index // self.num_per_prompt]

    def _logprobs(
        self,
        positions: list[generation_pb2.TokenLogprobs],
        offset: int,
        token_ids: list[int] | None = None,
    ) -> dict[str, Any] | None:
        num_top = num_top_logprobs(self.request.sampling)
        if num_top is None:
            return None
        name = token_namer(self.decode, self.request.tokens_as_ids)
        return completion_logprobs_json(positions, num_top, name, offset, token_ids)

    def _usage(self, answers: list[Answer]) -> generation_pb2.Usage | None:
        usage = total_usage(answers)
        step = self.num_per_prompt
        if usage is None or len(answers) <= step:
            return usage
        firsts = [answer.usage for answer in answers[::step] if answer.usage is not None]
        usage.prompt_tokens = sum(first.prompt_tokens for first in firsts)
        return usage


def completion_chunk(
    request_id: str,
    model: str,
    text: str,
    finish: int,
    logprobs: dict[str, Any] | None = None,
    index: int = 0,
    usage: generation_pb2.Usage | None = None,
) -> dict[str, Any]:
    """One streamed text_completion (an empty choices list with usage for the usage chunk)."""
    choice = {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason_name(finish),
    }
    choices = [] if usage is not None else [choice]
    body = envelope(f"cmpl-{request_id}", "text_completion", model, choices)
    if usage is not None:
        body["usage"] = usage_json(usage)
    return body


def completion_logprobs_json(
    positions: list[generation_pb2.TokenLogprobs],
    num_top: int,
    name: Namer,
    text_offset: int = 0,
    token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """OpenAI's completion logprobs of ``positions`` as vLLM's server writes them: tokens, their
    log probabilities, the ``num_top`` + 1 first candidates of each (the token first; all of them
    for ``ALL_CANDIDATES``) and each token's offset in the text, from ``text_offset``. Each
    position's token is ``token_ids``' there (``shown_candidate``; the first candidate where
    none is given); a position without candidates (an echoed prompt's first) has None for its
    log probabilities."""
    body: dict[str, list[Any]] = {"text_offset": [], "token_logprobs": [], "tokens": []}
    body["top_logprobs"] = []
    offset = text_offset
    shown = num_top if num_top == ALL_CANDIDATES else num_top + 1
    for index, position in enumerate(positions):
        body["text_offset"].append(offset)
        if not position.candidates:
            token = name((token_ids or [])[index], None)
            body["token_logprobs"].append(None)
            body["top_logprobs"].append(None)
        else:
            shown_id = token_ids[index] if token_ids and index < len(token_ids) else None
            generated = shown_candidate(position, shown_id)
            token = candidate_name(generated, name)
            body["token_logprobs"].append(max(generated.logprob, MIN_LOGPROB))
            body["top_logprobs"].append(
                {
                    candidate_name(c, name): max(c.logprob, MIN_LOGPROB)
                    for c in first_candidates(position, shown)
                }
            )
        body["tokens"].append(token)
        offset += len(token)
    return body
