"""What a study says, read from the stored study: which trials count (feasible, best first, the
budget spent), what screening found, the confirmed winner, the one recommendation with its gain over
the baseline, and a sensitivity move's band and verdict. The driver, the daemon and the report all ask here; nothing here presents.

Imports: measure (the statistic), config, record; optuna (it reads studies). Never driver/, daemon/,
report/, trial/ or ray.
"""
