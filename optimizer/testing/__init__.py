"""Helpers for tests and benches only (never imported by the product): a throwaway
`ray start --head`, and the tiny model's memory fraction for a chosen KV-cache size.

Imports: engine.
"""
