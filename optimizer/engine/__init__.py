"""The vLLM server process and what it says: start, health, stop of its whole process group
(vllm.py), failure classification from its log, what its start-up got of the CPU
(starvation.py), the cores it binds to on CPU (cpu_cores.py), the device it runs on, its
/metrics, the installed vLLM's version, a --speculative-config checked as vLLM would check it,
and the two demo models (the tiny one, the real SmolLM2 converted from its package).

Imports: errors only; aiohttp for /metrics.
"""
