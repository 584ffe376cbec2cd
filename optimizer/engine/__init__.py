"""The vLLM server process and what it says: start, health, stop of its whole process group
(vllm.py), failure classification from its log, the device it runs on, its /metrics, the
installed vLLM's version, and the tiny local model used on CPU.

Imports: errors only; aiohttp for /metrics.
"""
