"""The study driver, the only writer to the study: plan (validate, open) -> launch (ask, start a
Ray task) -> poll (phases, checkpoints, servers) -> tell (outcome -> Optuna state) -> confirm
(re-measure the top) -> minimal (put back what had no effect). study.py is the loop; store/ is
where the study lives.

Imports anything below it (search, config, trial, engine, measure, workload, outputs, verdict, text, record),
never report/: its console lines come from text/, and the optuna-dashboard notes are handed in
(Progress's `dashboard`). With trial/ the only package that imports ray; with search/, verdict/ and
report/ the only ones that import optuna.
"""
