"""No torch.compile at all in a test's eager vLLM, its sampler's included: the output check's first
answer with logprobs 11 s sooner, the start-up as long (docs/vllm-facts.md#sampler-compile). Set
beside `--enforce-eager` where the tuner's logic is tested; never in a user's trials."""

from __future__ import annotations

SAMPLER_EAGER_ENV = {"TORCH_COMPILE_DISABLE": "1"}
