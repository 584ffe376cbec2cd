"""Measuring a replay as a user would feel it: the streaming aiohttp replayer, summary metrics
(TTFT, TPOT, ITL, E2E, throughput), whether a replay can be trusted, SLOs, and run-to-run
noise (intervals).

Imports: workload, failure.py (what a replay that cannot be trusted is); aiohttp. Never engine/,
report/, optuna or ray.
"""
