"""Presenting a study for people: the console summary (best, gain, savings), the written report
and its pictures, diagnosis in operator words, the capacity plan in lines, notes for
optuna-dashboard. It presents only: what the study says is decided in verdict/, the capacity
plan computed in fleet/, the deployable files made by deploy/, and the words the driver and the
daemon share with it live in text/. Only the commands (cli/) import it; they hand its dashboard
notes and its console report to the driver and the daemon.

Imports: verdict, text, deploy, fleet, config, measure, engine (its names and parsers), record,
errors; optuna (it reads studies). Never driver/, trial/ or ray.
"""
