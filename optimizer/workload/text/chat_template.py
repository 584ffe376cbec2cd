"""A model directory's chat template, rendered the way vLLM's chat endpoint renders it.

Instruct models answer a prompt framed by their template (a system turn, a user turn, the
start of the assistant's turn); without it a small model rambles instead of answering, and a
"repeat this passage" request no longer produces the passage. The template is the Jinja text
in `chat_template.jinja`, or `chat_template` in `tokenizer_config.json`, rendered in a
sandbox with what Hugging Face templates use (`messages`, `add_generation_prompt`, `bos_token`,
`eos_token`, `raise_exception`, `strftime_now`, `{% break %}`). Only a local model directory's
template is read; a Hub id's prompts go out bare, and the workload's notes say so. The rendered text is then encoded with the model's tokenizer,
whose added tokens (`<|im_start|>` and the like) become their own ids.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from optimizer.errors import ConfigError, first_line


def load(model_dir: Path) -> Callable[[str], str] | None:
    """A function from one user message to the prompt text, or None when the directory has no template."""
    source = _template_text(model_dir)
    if source is None:
        return None
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415 - only text workloads need it

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        template = env.from_string(source)
    except Exception as exc:  # jinja2's TemplateSyntaxError and friends
        raise ConfigError(f"model {model_dir}: its chat template does not parse ({first_line(exc)}); fix it or "
                          "remove it to send the text without a template") from exc
    specials = _special_tokens(model_dir)

    def render(message: str) -> str:
        try:
            return template.render(messages=[{"role": "user", "content": message}], add_generation_prompt=True,
                                   **specials)
        except Exception as exc:  # the template's own raise_exception, an undefined name, ...
            raise ConfigError(f"model {model_dir}: its chat template refused one user message ({first_line(exc)}); "
                              "fix it or remove it to send the text without a template") from exc
    return render


def _raise(message: str):
    raise ValueError(message)


def _template_text(model_dir: Path) -> str | None:
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = _tokenizer_config(model_dir)
    text = config.get("chat_template")
    return text if isinstance(text, str) and text else None


def _tokenizer_config(model_dir: Path) -> dict:
    try:
        data = json.loads((model_dir / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _special_tokens(model_dir: Path) -> dict:
    config = _tokenizer_config(model_dir)
    out = {}
    for name in ("bos_token", "eos_token"):
        token = config.get(name)
        out[name] = token.get("content", "") if isinstance(token, dict) else (token or "")
    return out
