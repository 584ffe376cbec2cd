"""Shared fixtures for the unit tests (fast: no vLLM, no Ray)."""

import pytest

from optimizer.engine.tiny_model import write_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The tiny demo model directory (config + tokenizer), written once per session."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
