"""Helpers for tests and benches only (never imported by the product): a throwaway
`ray start --head`, the tiny model's memory fraction for a chosen KV-cache size, and what a
stopped driver left running (leftovers.py).

Imports: engine.
"""
