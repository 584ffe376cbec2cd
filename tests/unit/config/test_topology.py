"""config/topology.py: ranks from the parallel sizes, their labels, and the tensor-parallel sizes vLLM accepts."""

import pytest

from optimizer.config import topology
from optimizer.errors import ConfigError


def test_ranks_are_the_product_of_the_parallel_sizes():
    assert topology.ranks({}) == 1 and topology.label({}) == "1 engine"
    params = {"tensor-parallel-size": 2, "data-parallel-size": 2, "max-num-seqs": 8}
    assert topology.ranks(params) == 4 and topology.label(params) == "TP 2 x DP 2"
    assert topology.needs_processes(params) and not topology.needs_processes({"data-parallel-size": 2})
    assert topology.needs_processes({"pipeline-parallel-size": 2})


def test_tensor_parallel_sizes_must_divide_the_heads_as_vllm_checks():
    assert topology.tp_fits_heads(2, 8, 8) and topology.tp_fits_heads(8, 32, 4)  # KV heads replicated
    assert not topology.tp_fits_heads(4, 6, 6) and not topology.tp_fits_heads(4, 8, 6)
    assert topology.tp_fits_heads(3, 0, 0)  # heads not read: vLLM says at start
    assert topology.powers_of_two(6) == (1, 2, 4) and topology.powers_of_two(0) == (1,)
    with pytest.raises(ConfigError, match=r"^x: 3 does not divide the model's 8 attention heads \(8 KV heads\); "
                                          r"vLLM refuses it at start: use one of 1, 2, 4, 8$"):
        topology.check_tp("x", 3, 8, 8)
    with pytest.raises(ConfigError, match=r"is not a data-parallel-size; give a whole number >= 1"):
        topology.check_size("x", True, "data-parallel-size", None)
