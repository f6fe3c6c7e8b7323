"""The transformers reference engine: monolithic generate with raw images.

It is the correctness oracle (every disaggregated topology must produce its greedy tokens) and
a light aggregated fallback where vLLM is not installed. It runs the whole model in-process:
chat template, processor (image -> pixel patches and grid), vision tower, language model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image


@dataclass(frozen=True, slots=True)
class ReferenceResult:
    """Tokens and text of one generation, with token counts."""

    token_ids: list[int]
    text: str
    finish_reason: str
    num_prompt_tokens: int
    top2_margins: list[float] = field(default_factory=list)


class ReferenceEngine:
    """Greedy (or sampled) generation with transformers on one device.

    Messages follow the chat-template convention: ``{"role": ..., "content": [{"type": "text",
    "text": ...}, {"type": "image"}]}``; ``images`` fill the image parts in order.
    """

    def __init__(self, model_dir: str | Path, *, device: str = "cpu") -> None:
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.model_dir = Path(model_dir)
        self.processor = AutoProcessor.from_pretrained(self.model_dir)
        self.model = (
            AutoModelForImageTextToText.from_pretrained(self.model_dir, dtype=torch.float32)
            .to(device)
            .eval()
        )
        self.device = device

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The prompt text of ``messages`` with the generation prompt appended."""
        return str(
            self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        )

    def generate(
        self,
        messages: list[dict[str, Any]],
        images: list[Image.Image],
        *,
        max_tokens: int = 16,
        ignore_eos: bool = False,
    ) -> ReferenceResult:
        """Greedy-decode up to ``max_tokens`` tokens for ``messages`` with ``images``."""
        import torch

        prompt = self.render(messages)
        inputs = self.processor(text=[prompt], images=images or None, return_tensors="pt")
        inputs = inputs.to(self.device)
        eos = self.model.generation_config.eos_token_id
        with torch.no_grad():
            out = self.model.generate(
                **inputs,
                max_new_tokens=max_tokens,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                eos_token_id=None if ignore_eos else eos,
            )
        num_prompt = int(inputs["input_ids"].shape[1])
        tokens = [int(t) for t in out.sequences[0, num_prompt:].tolist()]
        finished_by_eos = not ignore_eos and bool(tokens) and tokens[-1] == eos
        margins = [float(top[0] - top[1]) for top in (s[0].topk(2).values for s in out.scores)]
        text = self.processor.tokenizer.decode(tokens, skip_special_tokens=True)
        return ReferenceResult(
            tokens, text, "stop" if finished_by_eos else "length", num_prompt, margins
        )
