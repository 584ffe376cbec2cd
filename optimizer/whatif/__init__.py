"""What a configuration would do on hardware the study never ran on: devices.py names the
accelerators it knows (memory, bandwidth, dense FLOPs, interconnect, each with its source);
roofline.py estimates KV capacity, TTFT, TPOT and throughput from first principles.

Imports: config (the model's facts), errors. No optuna, ray or aiohttp.
"""
