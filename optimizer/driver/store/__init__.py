"""Where a study lives on disk: the database (SQLite or any SQLAlchemy URL), the driver lock and
run-state file beside it (one driver per storage; what a dead one left), each trial's files
under artifacts/, and a finished study opened read-only for the commands that read it.

Imports: errors, engine/ (process groups), measure/ (SLOs), driver/plan.py (a study's stamp); optuna.
"""
