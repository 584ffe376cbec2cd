"""The twin's fixtures: the tiny model's shape, and a twin server from `vllm serve`-style flags."""

import pytest

from optimizer.config.model_info import load_model_info


@pytest.fixture(scope="session")
def model(tiny_model):
    return load_model_info(str(tiny_model), "bfloat16")


@pytest.fixture
def twin(model):
    """twin('--max-num-seqs', '4', ...) -> a TwinServer over a 1 GiB pool unless the flags say otherwise."""
    from optimizer.twin.server import TwinServer

    def make(*args: str, kv_bytes: int = 1 << 30):
        return TwinServer.from_flags(model, ["--max-model-len", "4096", "--kv-cache-memory-bytes", str(kv_bytes),
                                             *args])

    return make
