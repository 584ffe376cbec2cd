"""What the tool stores on a study and on its trials (Optuna user attributes), in one place.

Every key the tool writes or reads is named once here, with its default, and read through a typed
accessor or written through one writer per kind; no other module spells a key or touches
`user_attrs`. The stored format is the record's (version.py): old studies read unchanged.

- version.py: the record's version stamp, checked on opening a study (and stamped on an old one)
- of_study.py: what a study records about itself: its stamp, device, screening, the outputs reference
- of_generation.py: what the daemon records on each generation's study: the traffic, the publish decision
- of_trial.py: what a trial records: its role, its flags, what it measured, its failure
- remeasured.py: the runs made after the search: confirmation, minimal change, sensitivity, scaling

Imports: errors, and nothing else of the project (every package that reads a study imports it);
no optuna either: a study, a trial or a plain mapping of attributes is read through its methods.
"""
