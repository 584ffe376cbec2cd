"""One trial, the body of a Ray task: boot vLLM with the spec's flags, warm up, measure in stages
(or search the goodput rate), check outputs, stop. spec.py is what crosses the Ray boundary;
channel.py is how a running trial talks to the driver (a Ray actor).

Imports: config, engine, measure, workload, outputs; ray (channel.py). Never optuna.
"""
