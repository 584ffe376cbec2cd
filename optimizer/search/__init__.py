"""Who decides what to boot next: the sampler (sampler.py: TPE), a configuration drawn from the
space (suggest.py) and the knobs an asked trial runs (ask.py), the configurations queued ahead of
the sampler (enqueue.py: the baseline, warm starts, a configuration queued again), the screening
phase's moves and the knobs it lets go (screening.py), a proposed repeat told without a boot
(repeats.py), when the search is over (convergence.py), and the one-knob moves the `sensitivity`
command measures (sensitivity.py). The driver (and that command) calls it; it starts nothing and
measures nothing.

Imports: config (the space, flags, round values), verdict (what counts, what screening found),
record; optuna. Never driver/, daemon/, report/, trial/ or ray.
"""
