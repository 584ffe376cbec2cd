"""The study configuration and what it can ask of vLLM: the YAML schema (schema.py, workload_spec.py),
the goal presets, the search space and vLLM's cross-knob rules (space.py), knob=value text
(candidate.py), params <-> vLLM flags (flags.py), paths that must be directories, facts read
from the model's config.json, the KV-cache dtypes a device can start, and the KV-cache fit estimate.

Imports: errors, engine/ (device facts) only. No optuna, ray or aiohttp.
"""
