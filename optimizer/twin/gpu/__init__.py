"""The twin on a GPU: vLLM's scheduler with the defaults vLLM picks on that device (server.py), a step
cost from aiconfigurator-core's per-operation timings (library_cost.py) or the fitted roofline
(roofline_cost.py), corrected by a study's own runs on that GPU (correction.py), and `plan
--what-if`'s rows answered through it (whatif_rows.py)."""
