"""fleet/together.py: on CPU the replicas `scale` boots share one node's memory; what they claim
together is checked before any boot, and refused with the fraction that fits."""

import pytest

from optimizer.engine.device import GIB, NodeMemory
from optimizer.errors import ConfigError
from optimizer.fleet.together import memory_claims, with_fraction

NODE = NodeMemory(total=int(23.5 * GIB), available=int(20.0 * GIB))


def test_two_replicas_at_half_the_node_are_refused_with_the_fraction_that_fits():
    with pytest.raises(ConfigError) as refused:
        memory_claims(["--max-num-seqs", "64", "--gpu-memory-utilization", "0.5"], 2, NODE)
    assert str(refused.value) == ("2 replicas x 1 rank(s) at gpu-memory-utilization 0.5 claim 23.5 GiB of this node's "
                                  "memory together, and 20.0 GiB of 23.5 is available: pass --memory-fraction 0.42 "
                                  "(each replica's share that fits; its KV cache is then smaller than the trial's), "
                                  "or fewer --replicas")
    memory_claims(with_fraction(["--gpu-memory-utilization", "0.5"], 0.42), 2, NODE)  # the fraction named fits


def test_ranks_count_and_vllms_default_fraction_applies_when_none_is_given():
    with pytest.raises(ConfigError, match=r"2 replicas x 2 rank\(s\) at gpu-memory-utilization 0.92"):
        memory_claims(["--tensor-parallel-size", "2"], 2, NODE)
    memory_claims(["--gpu-memory-utilization=0.2", "--tensor-parallel-size", "2"], 2, NODE)  # 4 x 0.2 x 23.5 = 18.8


def test_the_fraction_replaces_every_spelling_of_the_flag():
    assert with_fraction(["--max-num-seqs", "8", "--gpu-memory-utilization", "0.5", "--gpu-memory-utilization=0.6"],
                         0.3) == ["--max-num-seqs", "8", "--gpu-memory-utilization", "0.3"]
