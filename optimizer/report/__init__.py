"""Reading a study for people: the console summary (best, gain, savings), the written report and
its pictures, diagnosis in operator words, the capacity plan, one-knob sensitivity, notes
for optuna-dashboard, and what a stored confirmation says.

Imports: config, measure, errors; optuna (it reads studies). Never driver/, trial/ or ray.
"""
