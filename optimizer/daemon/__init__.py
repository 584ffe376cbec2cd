"""The daemon: tune, watch the traffic, re-tune when it drifts (loop.py); the status API
(/healthz, /status, /metrics) in its own thread, fed by the driver's progress.

Imports: driver, verdict, text, deploy, config, workload, traffic, record (what a generation stores);
aiohttp (status API). Never report/: the command hands in the report it prints and the dashboard notes.
"""
