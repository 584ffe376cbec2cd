"""What a configuration would do on hardware the study never ran on (`plan --what-if`).

devices.py names the accelerators it knows (memory, bandwidth, dense FLOPs, interconnect, each
with its source); architecture.py reads a model's shape from its config.json; library.py asks
aiconfigurator-core where it has vLLM timings for the device; roofline.py estimates from first
principles elsewhere, with efficiencies fitted on published measurements; predict.py picks one;
calibration.py and study_calibration.py correct it with what a study measured and give the
band; fleet_rows.py turns it into replicas, devices and cost for a peak load, table.py into
the lines `plan` prints, and report_table.py into the written report's section.

Imports: config (the model's facts), measure (SLOs, the log-scale statistic), record, errors. No ray or aiohttp.
"""
