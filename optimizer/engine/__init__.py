"""The vLLM server process and what it says: start, health, stop of its whole process group
(vllm.py), failure classification from its log, what its start-up got of the CPU
(starvation.py), the cores it binds to on CPU (cpu_cores.py), the device it runs on, its
/metrics, the installed vLLM's version, and the tiny local model used on CPU.

Imports: errors only; aiohttp for /metrics.
"""
