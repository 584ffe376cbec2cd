"""Output regression: does a configuration still pick the baseline's tokens? compare.py sends the
fixed prompts greedily and compares; gate.py is the study's gate (a trial whose outputs flip
too often is pruned as output_changed).

Imports: engine, record (the reference answers, each trial's comparison), errors, shutdown. No optuna or ray.
"""
