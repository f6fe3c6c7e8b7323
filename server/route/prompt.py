"""Chat rendering, tokenisation and multimodal block hashes (streaming text: detokenize.py).

The prompt keeps one placeholder per image as the chat template emits it (Qwen families:
``<|vision_start|><|image_pad|><|vision_end|>``; LLaVA-1.5: ``<image>``), holding the model's image
token once; the engine expands it. A video's placeholder (Qwen2-VL, Qwen2.5-VL:
``<|vision_start|><|video_pad|><|vision_end|>``) likewise holds the video token once, which the
engine expands as the family's processor does: to the video's rows, or (Qwen3-VL) to each
temporal patch's ``<t seconds>`` text and its rows between vision start and end. For KV-aware
routing the route hashes the prompt as the engine will hold it (one expansion, ``_expanded``,
serves this and the expanded ids): each image's (or video's) rows become a pad value derived from
its mm_hash (as Dynamo and SGLang do), so prompts share a block hash only if they share every
token and image before it. Hashes chain block to
block; only full blocks count.

The chat template is the model's own, or ``--chat-template``'s (a file, or the Jinja text itself,
read as vLLM reads its own flag), checked once at start by rendering one image.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epd.server.models.model_dir import context_length
from epd.server.models.video import VideoPlan
from epd.server.route.request import ChatMessage, ChatPart, bad

BLOCK_SIZE = 16
# the side vLLM cuts a prompt on when a request names none (its tokenizer registry's default
# for a generating model, whatever the checkpoint's tokenizer says)
TRUNCATION_SIDE = "left"
JINJA_CHARACTERS = "{}\n"
# The chat a template is checked with: one image must render as one image token.
PROBE_CHAT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}]
#: what a video's one placeholder token expands to: its tokens where its family writes more than
#: its rows (``PromptBuilder.video_tokens``), else the number of its rows
VideoTokens = int | list[int]


@dataclass(frozen=True, slots=True)
class Rendered:
    """A chat as the route renders it: the chat template's text (vLLM's ``prompt_text``; None
    for a prompt given as token ids, or where nobody asked for it) and its token ids."""

    text: str | None
    token_ids: list[int]


def load_chat_template(text: str) -> str:
    """``--chat-template``'s template: the file ``text`` names, else ``text`` itself when it
    holds Jinja (a brace or a newline), as vLLM reads its ``--chat-template``; ValueError naming
    a file that cannot be read."""
    try:
        return Path(text).read_text()
    except (OSError, UnicodeDecodeError) as e:
        if any(character in text for character in JINJA_CHARACTERS):
            return text
        reason = e.strerror if isinstance(e, OSError) else "not text"
        raise ValueError(
            f"--chat-template {text}: neither a readable file ({reason}) nor a Jinja template"
        ) from None


class PromptBuilder:
    """The model's tokenizer and chat template, loaded once. ``chat_template``: a Jinja template
    used instead of the model's own; ValueError when it does not render one image as one image
    token."""

    def __init__(self, model_dir: str | Path, chat_template: str | None = None) -> None:
        from transformers import AutoConfig, AutoTokenizer

        from epd.server.models.registry import family_of_config

        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
        config = AutoConfig.from_pretrained(model_dir)
        self.image_pad_id = int(config.image_token_id)
        # NOTE: None for a family without video; a video then never reaches the prompt.
        video_token_id = getattr(config, "video_token_id", None)
        self.video_pad_id = int(video_token_id) if video_token_id is not None else None
        self.family, self.config = family_of_config(config), config
        start_ids, end_ids = self.family.image_delimiters(config, self.tokenizer)
        self.image_start_ids, self.image_end_ids = list(start_ids), list(end_ids)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.max_context_tokens = context_length(config)
        # --chat-template's text (None: the model's own template)
        self.route_template = chat_template
        if chat_template is not None:
            self.tokenizer.chat_template = chat_template
            self.check_template()

    def check_template(self) -> None:
        """ValueError unless the chat template renders, and renders one image as one image
        token (the placeholder the engine expands)."""
        import jinja2

        try:
            token_ids = self.render_chat_dicts(PROBE_CHAT).token_ids
        except jinja2.TemplateError as e:
            line = f" (line {e.lineno})" if isinstance(e, jinja2.TemplateSyntaxError) else ""
            raise ValueError(f"--chat-template does not render{line}: {e}") from None
        num_images = token_ids.count(self.image_pad_id)
        if num_images != 1:
            image = self.tokenizer.convert_ids_to_tokens(self.image_pad_id)
            raise ValueError(
                f"--chat-template renders one image as {num_images} {image} tokens, not 1: it "
                "must emit the model's image placeholder for each image part"
            )

    def num_chars(self, messages: list[ChatMessage]) -> int:
        """Text characters of ``messages`` (what tokenising costs grows with)."""
        return sum(len(part.text or "") for message in messages for part in message.parts)

    def token_ids(
        self,
        messages: list[ChatMessage],
        template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
        add_special_tokens: bool = False,
    ) -> list[int]:
        """Token ids of the rendered chat (``render``'s)."""
        return self.render(messages, template_kwargs, chat_template, add_special_tokens).token_ids

    def render(
        self,
        messages: list[ChatMessage],
        template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
        add_special_tokens: bool = False,
    ) -> Rendered:
        """The rendered chat, by default with the assistant's turn opened: its text and token
        ids. The chat is one ``request_check.check_content`` passed: messages, roles and sizes
        are not checked again. ``template_kwargs``: the request's (``ChatRequest.template_kwargs``);
        ``chat_template``: the request's own template (None: the route's; then, as vLLM, a
        ``chat_template`` among ``template_kwargs`` where the route has no ``--chat-template``),
        a 400 naming ``chat_template`` when it does not render the chat;
        ``add_special_tokens``: the tokenizer's own special tokens (a BOS) added to the
        rendered text's, as vLLM's request field (its chat default: none)."""
        chat = [
            {
                "role": message.role,
                "content": [_template_part(part) for part in message.parts],
                **message.template_fields,
            }
            for message in messages
        ]
        if chat_template is None and template_kwargs and "chat_template" in template_kwargs:
            chat_template = self.route_template or template_kwargs["chat_template"]
        if chat_template is not None:
            return self._with_request_template(
                chat, template_kwargs, chat_template, add_special_tokens
            )
        try:
            return self.render_chat_dicts(chat, template_kwargs, None, add_special_tokens)
        except Exception as e:  # noqa: BLE001 - a template raises what its author chose
            raise bad(f"the chat template refused the chat: {e}"[:1024], "messages") from None

    def _with_request_template(
        self,
        chat: list[dict[str, Any]],
        template_kwargs: dict[str, Any] | None,
        template: str,
        add_special_tokens: bool = False,
    ) -> Rendered:
        """``chat`` rendered with a request's own template as vLLM renders it: the message
        content as the template reads it (vLLM's detected content format: parts, or their texts
        joined by newlines); a chat with images or videos must get one placeholder each."""
        from vllm.renderers.hf import _detect_content_format

        num_media = sum(1 for m in chat for part in _parts(m) if part["type"] != "text")
        # NOTE: the template itself is no argument of the template (vLLM passes it apart)
        template_kwargs = {k: v for k, v in (template_kwargs or {}).items() if k != "chat_template"}
        try:
            template = self.tokenizer.get_chat_template(template)
            if _detect_content_format(template, default="string") == "string":
                chat = [{**m, "content": _joined_text(m)} for m in chat]
            rendered = self.render_chat_dicts(chat, template_kwargs, template, add_special_tokens)
        except Exception as e:  # noqa: BLE001 - a template raises what its author chose
            message = f"the request's chat_template does not render the chat: {e}"
            raise bad(message[:1024], "chat_template") from None
        placeholders = {self.image_pad_id, self.video_pad_id}
        if num_media and sum(t in placeholders for t in rendered.token_ids) != num_media:
            raise bad(
                "the request's chat_template must render each image or video part as the "
                "model's placeholder",
                "chat_template",
            )
        return rendered

    def render_chat_dicts(
        self,
        chat: list[dict[str, Any]],
        template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
        add_special_tokens: bool = False,
    ) -> Rendered:
        """Text and token ids of ``chat`` (chat-template form) rendered with ``template_kwargs``
        as vLLM passes a request's to the template (those it neither takes nor names are
        dropped) and ``chat_template`` (None: the route's), tokenised with or without the
        tokenizer's special tokens; raises what the template raises."""
        kwargs: dict[str, Any] = {"add_generation_prompt": True}
        template = chat_template or self.tokenizer.chat_template
        if template_kwargs:  # NOTE: only the OpenAI door sends them, and it runs with vLLM
            from vllm.renderers.hf import resolve_chat_template_kwargs

            kwargs = resolve_chat_template_kwargs(
                self.tokenizer, template, {**kwargs, **template_kwargs}
            )
        text = self.tokenizer.apply_chat_template(
            chat, tokenize=False, chat_template=chat_template, **kwargs
        )
        token_ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        return Rendered(text, list(token_ids))

    def video_tokens(self, plan: VideoPlan) -> VideoTokens:
        """What the placeholder token of the video ``plan`` plans expands to, as the engine
        expands it: the tokens its family writes where they are more than its rows (Qwen3-VL:
        each temporal patch's ``<t seconds>``, then its rows between vision start and end),
        else the number of its rows."""
        timestamps = plan.timestamps or ()
        written = self.family.video_prompt_tokens(
            plan.grid, timestamps, self.config, self.tokenizer
        )
        return written or plan.num_tokens

    def expanded_ids(
        self, token_ids: list[int], image_tokens: list[int], video_tokens: Sequence[VideoTokens]
    ) -> list[int]:
        """The prompt as the engine holds it (vLLM's ``prompt_token_ids``): each image's
        placeholder token repeated to its number of tokens (``image_tokens``, in prompt order)
        between the family's delimiters, each video's expanded to its own (``video_tokens``)."""
        images = [(num_tokens, None) for num_tokens in image_tokens]
        return self._expanded(
            token_ids, images, [(num_tokens, None) for num_tokens in video_tokens]
        )

    def _expanded(
        self,
        token_ids: list[int],
        images: Sequence[tuple[int, int | None]],
        videos: Sequence[tuple[VideoTokens, int | None]],
        missing: int | None = None,
    ) -> list[int]:
        """``token_ids`` with each image's and video's placeholder token expanded as the engine
        expands it, each row given its item's fill: an image's (number of rows, fill) becomes
        its rows between the family's delimiters, a video's (``VideoTokens``, fill) its tokens
        with the fill for each video token. A fill of None is the placeholder token itself; a
        placeholder beyond the items given becomes one row of ``missing``."""
        pending = {self.image_pad_id: iter(images), self.video_pad_id: iter(videos)}
        expanded: list[int] = []
        for token in token_ids:
            if token not in pending:
                expanded.append(token)
                continue
            rows, fill = next(pending[token], (1, missing))
            row = token if fill is None else fill
            if isinstance(rows, list):
                expanded.extend(row if written == token else written for written in rows)
            elif token == self.image_pad_id:
                expanded.extend([*self.image_start_ids, *[row] * rows, *self.image_end_ids])
            else:
                expanded.extend([row] * rows)
        return expanded

    def truncated(
        self,
        token_ids: list[int],
        keep: int,
        side: str | None,
        image_tokens: list[int],
        video_tokens: Sequence[VideoTokens],
    ) -> list[int]:
        """vLLM's ``truncate_prompt_tokens``: ``token_ids`` cut to ``keep`` tokens (``side``
        left keeps the last, right the first; None: left, the side vLLM's tokenizer gets for a
        generating model), then cut
        again once each image and video is expanded to its tokens (``image_tokens``,
        ``video_tokens``), as vLLM cuts the expanded prompt. A cut that would split or drop an
        image or a video is a 400 naming ``truncate_prompt_tokens``, as vLLM refuses it."""
        side = side or TRUNCATION_SIDE
        media = {self.image_pad_id, self.video_pad_id}
        kept = _cut(token_ids, len(token_ids) - keep, side)
        excess = len(self.expanded_ids(kept, image_tokens, video_tokens)) - keep
        cut = _cut(kept, excess, side)
        num_media = sum(token in media for token in token_ids)
        if sum(token in media for token in cut) != num_media:
            raise bad(
                f"truncate_prompt_tokens={keep} would split or drop a multimodal item: "
                "multimodal placeholders expand after truncation is applied, so the limit must "
                "leave every multimodal item intact. Please raise truncate_prompt_tokens or "
                "shorten the multimodal input.",
                "truncate_prompt_tokens",
            )
        return cut

    def block_hashes(
        self,
        token_ids: list[int],
        images: list[tuple[str, int]],
        videos: Sequence[tuple[str, VideoTokens]] | None = None,
        salt: str = "",
        param: str = "messages",
    ) -> list[int]:
        """Chained hashes of the full blocks of the expanded prompt (``_expanded``), each image's
        and video's rows a pad value derived from its mm_hash; ``images`` holds (mm_hash, number
        of image tokens) per image, in prompt order, ``videos`` (mm_hash, ``VideoTokens``) per
        video. ``salt`` (the request's ``hashing.key_salt``; "" for none) is mixed into the
        first block, as vLLM mixes a request's cache_salt, so the whole chain is the tenant's
        own. The same expansion is the engine's prompt length: a 400 naming ``param``
        (``PROMPT_TOO_LONG``, as the engines refuse it) when it leaves no room for an answer in
        the model's context, so that nothing is encoded for a prompt the engine would refuse."""
        pictures = [(num_tokens, _pad(mm_hash)) for mm_hash, num_tokens in images]
        clips = [(tokens, _pad(mm_hash)) for mm_hash, tokens in videos or []]
        expanded = self._expanded(token_ids, pictures, clips, _pad(""))
        context = self.max_context_tokens
        if context is not None and len(expanded) >= context:
            raise bad(
                f"the prompt expands to {len(expanded)} tokens; the model's context is "
                f"{context} tokens, which leaves no room for an answer",
                param,
                "PROMPT_TOO_LONG",
            )
        hashes, previous = [], f"{salt}|".encode() if salt else b""
        for start in range(0, len(expanded) - BLOCK_SIZE + 1, BLOCK_SIZE):
            block = ",".join(map(str, expanded[start : start + BLOCK_SIZE])).encode()
            digest = hashlib.blake2b(previous + block, digest_size=8).digest()
            hashes.append(int.from_bytes(digest, "little") & (2**63 - 1))
            previous = digest
        return hashes


def _pad(mm_hash: str) -> int:
    """The value an item's rows hash as: negative, so no token id, and the item's own."""
    return -(int(mm_hash[:15] or "0", 16) + 1)


def _cut(token_ids: list[int], excess: int, side: str) -> list[int]:
    """``token_ids`` less ``excess`` tokens (none when it is not positive) on ``side``."""
    if excess <= 0:
        return token_ids
    return token_ids[excess:] if side == "left" else token_ids[: len(token_ids) - excess]


def _parts(message: dict[str, Any]) -> list[dict[str, str]]:
    """A chat-template message's content parts (none where its content is already one string,
    as a tool result's)."""
    content = message["content"]
    return content if isinstance(content, list) else []


def _joined_text(message: dict[str, Any]) -> str:
    """A message's text parts as one string, as vLLM gives a template that reads the content as
    a string (``wrap_dicts`` off)."""
    if isinstance(message["content"], str):
        return str(message["content"])
    return "\n".join(part["text"] for part in _parts(message) if part["type"] == "text")


def _template_part(part: ChatPart) -> dict[str, str]:
    """A chat part as chat templates take it."""
    if part.image is not None:
        return {"type": "image"}
    if part.video is not None:
        return {"type": "video"}
    return {"type": "text", "text": part.text or ""}
