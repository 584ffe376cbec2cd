"""What one engine step costs: the twin's only model of its own (the scheduling is vLLM's).

A step is described by the work vLLM scheduled in it (`StepShape`), and a step-cost model maps
that to seconds. Every model answers through one interface, `StepCost.seconds(shape)`, plus
`intake_s`: the time from a client's send to the request being visible to the scheduler (the
HTTP front end, tokenizing, the hop to the engine process) and back out as a streamed chunk.

`LinearStepCost` is a sum of terms, each a coefficient times a count the step holds:

    step_s               1 per step: the forward pass's fixed cost (launch, norms, sampling, the
                         engine loop and output processing), whatever the batch
    prefill_token_s      per prompt token computed in the step (chunks): the GEMMs over new tokens
    prefill_attention_s  per prompt token x 1,000 tokens it attends to (its context before the
                         chunk plus half the chunk): prefill attention grows with the context
    decode_seq_s         per sequence decoding one token: the GEMMs and sampling of one row
    decode_context_s     per 1,000 tokens of context the decoding sequences read: decode
                         attention's work over every cached token, once per step
    decode_kv_s          per 1,000 tokens of the decoding sequences' context in distinct KV blocks:
                         the memory decode attention streams. A block that several sequences share
                         through the prefix cache is one block in memory, read once from RAM and
                         then from the CPU's caches, so sequences that share a long prefix read far
                         less memory than the same contexts unshared. Without sharing it equals the
                         decode context, and the fit gives a tie to the context term (fit.py)

With an fp8 KV cache the four KV-side terms (`prefill_token_s`, whose KV writes are quantized,
`prefill_attention_s`, `decode_context_s` and `decode_kv_s`) are separate coefficients
(`fp8_*`): fp8 costs differ from bf16 differently in prefill and decode, and not the same
way on every CPU, so a calibration needs one run per KV dtype. All coefficients are >= 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

BASE_TERMS = ("step_s", "prefill_token_s", "prefill_attention_s", "decode_seq_s", "decode_context_s", "decode_kv_s")
FP8_TERMS = ("fp8_prefill_token_s", "fp8_prefill_attention_s", "fp8_decode_context_s", "fp8_decode_kv_s")
TERMS = BASE_TERMS + FP8_TERMS
COLUMN = {name: i for i, name in enumerate(TERMS)}
# Where each of a step's counts goes (BASE_TERMS' order), without and with an fp8 KV cache.
_LAYOUT = tuple(COLUMN[n] for n in BASE_TERMS)
_LAYOUT_FP8 = tuple(COLUMN.get("fp8_" + n, COLUMN[n]) for n in BASE_TERMS)
FP8_FALLBACK = {COLUMN["fp8_" + n]: COLUMN[n] for n in BASE_TERMS if "fp8_" + n in COLUMN}


def is_fp8(kv_cache_dtype: str) -> bool:
    return str(kv_cache_dtype).startswith("fp8")


@dataclass(frozen=True)
class StepShape:
    """The work of one engine step, as vLLM's scheduler laid it out."""

    prefill_tokens: int = 0
    prefill_attention: float = 0.0  # sum over prefill chunks of tokens x (context before + tokens / 2) / 1,000
    prefill_seqs: int = 0  # sequences with a prompt chunk in the step (not a cost term: kept for the record)
    decode_seqs: int = 0
    decode_context: float = 0.0  # sum over decoding sequences of their context / 1,000
    fp8: bool = False
    chunks: tuple = ()  # (tokens, context before) of each prompt chunk: what a per-operation GPU cost prices
    decode_kv: float = 0.0  # decode_context less the tokens in blocks another decoding sequence also holds

    def counts(self) -> tuple:
        return (1.0, self.prefill_tokens, self.prefill_attention, self.decode_seqs, self.decode_context, self.decode_kv)

    def columns(self) -> tuple:
        return _LAYOUT_FP8 if self.fp8 else _LAYOUT

    def features(self) -> np.ndarray:
        """The step's counts laid out in TERMS' order (the fp8 columns used instead when fp8)."""
        row = np.zeros(len(TERMS))
        row[list(self.columns())] = self.counts()
        return row


class StepCost(Protocol):
    """Seconds one step takes, and the constant time a request spends outside the engine."""

    name: str
    intake_s: float

    def seconds(self, shape: StepShape) -> float: ...


@dataclass(frozen=True)
class LinearStepCost:
    """A step costs the dot product of its counts with `coefficients` (seconds per unit, TERMS' order)."""

    coefficients: tuple[float, ...]
    intake_s: float = 0.0
    name: str = "fitted linear step cost"
    calibrated_on: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self):
        if len(self.coefficients) != len(TERMS):
            raise ValueError(f"a linear step cost needs {len(TERMS)} coefficients ({', '.join(TERMS)})")

    def seconds(self, shape: StepShape) -> float:
        c = self.coefficients  # plain arithmetic: the twin asks once per step, tens of thousands of times
        return sum(c[j] * v for j, v in zip(shape.columns(), shape.counts()))

    def as_dict(self) -> dict:
        return {**dict(zip(TERMS, self.coefficients)), "intake_s": self.intake_s,
                "calibrated_on": list(self.calibrated_on)}

    @classmethod
    def from_dict(cls, data: dict) -> "LinearStepCost":
        return cls(tuple(float(data[t]) for t in TERMS), float(data.get("intake_s", 0.0)),
                   calibrated_on=tuple(data.get("calibrated_on", ())))

    def describe(self) -> str:
        parts = [f"{name.removesuffix('_s')} {value * 1000:.4g} ms" for name, value in zip(TERMS, self.coefficients)
                 if value > 0]
        return ", ".join(parts) + f"; intake {self.intake_s * 1000:.3g} ms"
