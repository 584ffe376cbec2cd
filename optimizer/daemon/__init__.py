"""The daemon: tune, watch the traffic, re-tune when it drifts (loop.py); the status API
(/healthz, /status, /metrics) in its own thread, fed by the driver's progress.

Imports: driver, verdict, report, config, workload, record (what a generation stores); aiohttp (status API).
"""
