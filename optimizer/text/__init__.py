"""Words every surface shares: a knob's value and a configuration on one line (knobs.py), what a
study says (verdicts.py: the confirmation, the screening, a reversion's effect, "What mattered",
the gain), a sensitivity move's outcome (sensitivity.py), and what the output check found
(outputs.py).

It sits below the driver, the daemon and report/ and above verdict/: the driver's console lines,
the daemon's status and webhook, and the written report all say the same thing in the same words,
so the words live where all three may import them, and report/ stays the one place that presents
a whole study.

Imports: measure (the reversion's tolerance), verdict (the recommendation's rows). No optuna, ray or aiohttp.
"""
