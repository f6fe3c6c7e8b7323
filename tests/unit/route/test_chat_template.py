"""``--chat-template``: a file or inline Jinja, used instead of the model's own, and checked
at start."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from epd.server.route import cli
from epd.server.route.prompt import PromptBuilder, load_chat_template
from epd.server.route.request import ChatMessage, ChatPart, ImageSource

# Qwen2-VL's placeholder, as the tiny model's own template writes it.
TEMPLATE = (
    "{% for m in messages %}<<{{ m.role }}>>{% for p in m.content %}{% if p.type == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ p.text }}{% endif %}{% endfor %}"
    "\n{% endfor %}<<assistant>>"
)
CHAT = [ChatMessage("user", [ChatPart(image=ImageSource(url="u")), ChatPart(text="what?")])]


def test_a_file_or_inline_jinja_is_the_template(tmp_path: Path) -> None:
    path = tmp_path / "chat.jinja"
    path.write_text(TEMPLATE)
    assert load_chat_template(str(path)) == TEMPLATE
    assert load_chat_template(TEMPLATE) == TEMPLATE
    with pytest.raises(ValueError, match="--chat-template missing.jinja: neither a readable file"):
        load_chat_template("missing.jinja")


def test_a_custom_template_changes_the_prompts_tokens(tiny_model_dir: Path) -> None:
    own = PromptBuilder(tiny_model_dir)
    custom = PromptBuilder(tiny_model_dir, TEMPLATE)
    ids = custom.token_ids(CHAT)
    assert ids != own.token_ids(CHAT)
    text = custom.tokenizer.decode(ids)
    assert text.startswith("<<user>><|vision_start|><|image_pad|><|vision_end|>what?")
    assert text.endswith("<<assistant>>")
    assert ids.count(custom.image_pad_id) == 1


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("{% for m in messages %}", r"does not render \(line 1\)"),
        ("{{ raise_exception('no images here') }}", "does not render: no images here"),
        ("{% for m in messages %}{{ m.role }}{% endfor %}", "as 0 <|image_pad|> tokens, not 1"),
    ],
)
def test_a_bad_template_is_refused_at_start(
    tiny_model_dir: Path, template: str, reason: str
) -> None:
    with pytest.raises(ValueError, match=f"--chat-template {reason}"):
        PromptBuilder(tiny_model_dir, template)


def test_the_route_refuses_a_template_it_cannot_read(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="epd route")
    cli.add_arguments(parser)
    args = parser.parse_args(["--model", str(tiny_model_dir), "--chat-template", "nope.jinja"])
    assert cli.run(args) == 2
    assert "epd route: --chat-template nope.jinja: neither a readable file" in (
        capsys.readouterr().err
    )
    assert parser.parse_args(["--model", "m"]).chat_template is None
