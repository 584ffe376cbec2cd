"""The command line, one module per command (`python -m optimizer` or `vllm-optimizer`):

    run  daemon  report  plan  regress  sensitivity  workload  tiny-model

Each command module has NAME, register(subparsers) and main(ns, console); entry.py builds the
parser from them (entry.py). Commands may import every other package; nothing imports cli/.
"""

from optimizer.cli.entry import main

__all__ = ["main"]
