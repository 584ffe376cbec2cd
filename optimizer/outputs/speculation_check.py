"""The output check for a configuration with speculative decoding: which flips speculation adds,
and which come from batching alone.

Greedy decoding on a server is not one fixed sequence: the same prompt can come out differently
alone and beside seven others (another batch shape, other kernels, other rounding), with or
without speculation. So a speculating candidate is compared with the baseline at the *same*
batch size, alone and `batch` at a time; and the baseline alone is compared with the baseline
batched, which is what batching flips without any speculation. Each rate is the top-1 flip rate
of outputs/compare.py. What speculation adds is the larger of its two same-batch rates: that is
what the gate holds to `regression.max_flip_rate`.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.outputs.compare import Comparison, Output, compare


@dataclass(frozen=True)
class SpeculationCheck:
    batch: int  # prompts in flight in the batched pass
    batching: Comparison  # the baseline alone vs the baseline batched: no speculation anywhere
    alone: Comparison  # the baseline vs the candidate, both one prompt at a time
    batched: Comparison  # the baseline vs the candidate, both `batch` at a time

    @property
    def flip_rate(self) -> float:
        """What speculation adds: the larger of the two rates at equal batch sizes."""
        return max(self.alone.flip_rate, self.batched.flip_rate)

    def summary(self) -> str:
        return (f"speculation adds a top-1 flip rate of {self.alone.flip_rate:.3f} alone and "
                f"{self.batched.flip_rate:.3f} at batch {self.batch} (vs the baseline at the same batch size: "
                f"{self.alone.prompts_diverged} and {self.batched.prompts_diverged} of {self.alone.prompts} prompts "
                f"diverge); batching alone flips {self.batching.flip_rate:.3f} without speculation "
                f"({_prompts(self.batching.prompts_diverged)}, the baseline alone vs at batch {self.batch})")

    def to_dict(self) -> dict:
        return {"batch": self.batch, "flip_rate": self.flip_rate, "alone": self.alone.to_dict(),
                "batched": self.batched.to_dict(), "batching": self.batching.to_dict()}


def _prompts(n: int) -> str:
    return f"{n} prompt" + ("" if n == 1 else "s")


def split(outputs: list[Output]) -> tuple[list[Output], list[Output]]:
    """The outputs answered alone and those answered in a batch (Output.batch > 1)."""
    return [o for o in outputs if o.batch == 1], [o for o in outputs if o.batch > 1]


def check(reference: list[Output], candidate: list[Output]) -> SpeculationCheck | None:
    """The three comparisons, or None when either side lacks its batched answers. Raises ValueError
    when the two sides cover different prompts (compare's rule)."""
    ref_alone, ref_batched = split(reference)
    cand_alone, cand_batched = split(candidate)
    if not ref_batched or not cand_batched:
        return None
    return SpeculationCheck(ref_batched[0].batch, compare(ref_alone, ref_batched), compare(ref_alone, cand_alone),
                            compare(ref_batched, cand_batched))
