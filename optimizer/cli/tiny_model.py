"""`tiny-model`: write the tiny local demo model (a Llama-architecture config and tokenizer)."""

from __future__ import annotations

import argparse

NAME = "tiny-model"


def register(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="write the tiny local demo model")
    p.add_argument("directory")
    p.add_argument("--weights", action="store_true", help="also write seeded random weights (model.safetensors), "
                   "served without --load-format dummy: for the output check (regress)")
    return p


def main(ns: argparse.Namespace, console) -> int:
    from optimizer.engine.tiny_model import write_tiny_model

    print(write_tiny_model(ns.directory, weights=ns.weights))
    return 0
