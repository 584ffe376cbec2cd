"""Presenting a study for people: the console summary (best, gain, savings), the written report
and its pictures, what the study says in words (verdict_text), diagnosis in operator words, the
capacity plan, one-knob sensitivity, notes for optuna-dashboard. What the study says is decided
in verdict/.

Imports: verdict, config, measure, engine (its names and parsers), record, errors; optuna (it reads studies).
Never driver/, trial/ or ray.
"""
