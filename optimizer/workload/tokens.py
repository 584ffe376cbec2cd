"""Prompt tokens: random ordinary token ids, seeded shared blocks, and text through the served
model's own tokenizer.

Prompts are sent to vLLM as token ids, so a prompt of n tokens is exactly n tokens on the
server (no re-tokenization drift, no BOS added); the replay checks this against vLLM's
`prompt_tokens` counter. Text from a trace is encoded with the model's tokenizer
(`tokenizer.json` in the model directory or on the Hub; transformers' AutoTokenizer otherwise).
"""

from __future__ import annotations

import random
from functools import cached_property, lru_cache
from pathlib import Path

from optimizer.errors import ConfigError
from optimizer.workload.text import chat_template

FIRST_ORDINARY_ID = 3  # ids below are special tokens in Llama-style vocabularies
MAX_DRAWN_ID = 32000  # stay inside the base vocabulary of any tokenizer we may meet


class Vocabulary:
    """Where prompt tokens come from for one model."""

    def __init__(self, vocab_size: int, tokenizer_source: str | None = None, max_positions: int | None = None):
        self.top = min(vocab_size, MAX_DRAWN_ID)
        self.tokenizer_source = tokenizer_source
        self.max_positions = max_positions  # the longest request (prompt + output) the model takes
        if self.top <= FIRST_ORDINARY_ID:
            raise ConfigError(f"model: vocab_size {vocab_size} leaves no ordinary tokens to build prompts from")

    def random_ids(self, rng: random.Random, n: int) -> tuple[int, ...]:
        """n ordinary token ids: unrelated prompts share no prefix, so the prefix cache cannot flatter a trial."""
        return tuple(rng.randrange(FIRST_ORDINARY_ID, self.top) for _ in range(n))

    def block(self, key: str, n: int) -> tuple[int, ...]:
        """The same n ids for the same key, in any process: a shared prefix (document, tool list, hash id)."""
        return _block(self.top, key, n)

    @cached_property
    def _tokenizer(self):
        src = self.tokenizer_source
        if not src:
            raise ConfigError("workload: this trace holds text but the model's tokenizer is unknown")
        local = Path(src).expanduser() / "tokenizer.json"
        try:
            from tokenizers import Tokenizer

            if local.is_file():
                return Tokenizer.from_file(str(local)).encode
            if not Path(src).expanduser().is_dir():
                from huggingface_hub import hf_hub_download

                return Tokenizer.from_file(hf_hub_download(src, "tokenizer.json")).encode
        except Exception:  # no tokenizer.json (sentencepiece-only models): try transformers below
            pass
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(src)
            return lambda text, add_special_tokens=False: _Ids(tok.encode(text, add_special_tokens=False))
        except Exception as exc:
            raise ConfigError(f"workload: cannot load the tokenizer of {src} ({type(exc).__name__}); "
                              "text prompts need it: check the model directory or use token counts") from exc

    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of `text` under the served model's tokenizer, without special tokens."""
        return tuple(self._tokenizer(text, add_special_tokens=False).ids)

    def chat(self, message: str) -> tuple[int, ...]:
        """Token ids of one user turn as the served model's chat template frames it (an answer
        follows), or of the message alone when the model has no template."""
        template = self._chat_template
        return self.encode(template(message) if template else message)

    @property
    def has_chat_template(self) -> bool:
        return self._chat_template is not None

    @cached_property
    def _chat_template(self):
        src = Path(self.tokenizer_source or "").expanduser()
        return chat_template.load(src) if self.tokenizer_source and src.is_dir() else None


@lru_cache(maxsize=4096)  # a Mooncake trace names the same 512-token blocks over and over
def _block(top: int, key: str, n: int) -> tuple[int, ...]:
    rng = random.Random(f"block:{key}")
    return tuple(rng.randrange(FIRST_ORDINARY_ID, top) for _ in range(n))


class _Ids:
    def __init__(self, ids):
        self.ids = ids
