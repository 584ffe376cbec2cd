"""The three goals operators usually tune for, as presets (`--goal chat|batch|agent`).

Each preset sets the objective, its SLOs and a workload shaped like that traffic; the
config file's own `objective` and `workload` sections are replaced, and explicit flags
(`--workload`, `--objective`, `--metric`, `--slo`) still win over the preset.

- chat: what users feel first is the wait for the first token. Minimize p95 TTFT, with
  p95 TPOT <= 50 ms as a constraint (streaming must stay readable); mostly short
  questions, some long documents, 32 users in a closed loop.
- batch: offline jobs; only output tokens/s matter, no latency SLO; everything queued.
- agent: tool-calling sessions that arrive in bursts; maximize the request rate a server
  carries with p95 TTFT <= 1000 ms and p95 TPOT <= 50 ms (goodput), on multi-turn
  sessions whose context grows turn by turn and whose starts are bursty (gamma).

The workloads are sized for the tiny CPU model of the quickstart (a few minutes per
trial); on a GPU, raise `requests`/`sessions` and the token ranges in your own config.
"""

from __future__ import annotations

PRESETS: dict[str, dict] = {
    "chat": {
        "objective": {"name": "latency", "metric": "ttft_p95", "slos": "tpot:50"},
        "workload": {"scenario": "chat", "seed": 0, "requests": 96, "warmup_requests": 4, "long_share": 0.1,
                     "short_input": [16, 128], "long_input": [512, 1536], "output": [64, 256],
                     "arrival": {"process": "closed", "concurrency": 32}},
    },
    "batch": {
        "objective": {"name": "throughput", "metric": "output_throughput"},
        "workload": {"scenario": "batch", "seed": 0, "requests": 128, "input": [128, 1024], "output": [64, 256],
                     "warmup_requests": 4},
    },
    "agent": {
        "objective": {"name": "goodput", "slos": "ttft:1000 tpot:50"},
        "workload": {"scenario": "agent", "seed": 0, "sessions": 12, "turns": [2, 5], "system_tokens": 512,
                     "user_input": [32, 256], "tool_result": [16, 2048], "output": [16, 96], "think_s": [0.0, 0.5],
                     "max_context": 8192, "warmup_requests": 4,
                     "arrival": {"process": "gamma", "rate": 1.0, "burstiness": 0.3}},
    },
}


def preset(goal: str) -> dict:
    """The config sections a goal sets; raises KeyError naming the known goals."""
    if goal not in PRESETS:
        raise KeyError(f"unknown goal '{goal}'; use one of {', '.join(PRESETS)}")
    return {key: dict(value) for key, value in PRESETS[goal].items()}
