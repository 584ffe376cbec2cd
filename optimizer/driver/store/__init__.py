"""Where a study lives on disk: the database (SQLite or any SQLAlchemy URL), the driver lock and
run-state file beside it (one driver per storage; what a dead one left), each trial's files
under artifacts/, and a finished study opened read-only for the commands that read it.

Imports: errors, record/ (the record and its version), engine/ (process groups), measure/ (SLOs),
objectives/, and from driver/ a study's stamp (plan.py) and the Ray-job check (ray_runtime.py), to
read a finished study as `run` wrote it; optuna.
"""
