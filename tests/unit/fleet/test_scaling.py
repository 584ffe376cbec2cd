"""fleet/scaling.py and fleet/together.py's placements: the efficiency, its interval on the one
statistic (log scale, noise pooled over both sides), and each replica on devices of its own."""

from __future__ import annotations

import math

import pytest

from optimizer.errors import ConfigError
from optimizer.fleet.scaling import Scaling, for_trial, scaling_of, with_record
from optimizer.fleet.together import placements
from optimizer.measure.noise import pooled, ratio


def test_efficiency_is_the_fleet_against_replicas_times_one_alone():
    s = scaling_of([10.0, 12.0], [19.0, 21.0], 2, trial=3)
    assert s.efficiency == pytest.approx(math.sqrt(19 * 21) / (2 * math.sqrt(10 * 12)))
    r = ratio([19.0, 21.0], [20.0, 24.0], pooled([[10.0, 12.0], [19.0, 21.0]]))
    assert (s.low, s.high) == pytest.approx((r.low, r.high))
    assert 0 < s.low < s.efficiency < s.high and s.noise_df == 2
    assert "2 replicas of trial 3 behind nginx carried 0.91x (95% CI" in s.describe()


def test_one_run_a_side_has_no_interval_and_says_so():
    s = scaling_of([10.0], [18.0], 2, trial=0)
    assert s.low is None and s.high is None and s.efficiency == pytest.approx(0.9)
    assert "one run a side: no noise to pool, no interval" in s.describe()


def test_the_record_round_trips_and_is_never_borrowed_by_another_trial():
    s = scaling_of([10.0, 11.0], [20.0, 21.0], 2, trial=4, date="2026-12-04", data_parallel={"trial": 2, "goodput": 15.0})

    class Study:
        user_attrs = {}

    baseline = scaling_of([9.0, 9.5], [17.0, 18.0], 2, trial=0)
    Study.user_attrs = {"scaling": with_record(Study, s)}
    Study.user_attrs = {"scaling": with_record(Study, baseline)}
    assert Scaling.from_dict(s.as_dict()) == s
    assert for_trial(Study, 4) == s and for_trial(Study, 0) == baseline and for_trial(Study, 5) is None


def test_each_replica_gets_cores_of_its_own_one_list_a_rank(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert placements(["--max-num-seqs", "8"], 2, cores=[0, 1], gpus=0) == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0"}, {"VLLM_CPU_OMP_THREADS_BIND": "1"}]
    assert placements(["--tensor-parallel-size", "2"], 2, cores=list(range(8)), gpus=0) == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, {"VLLM_CPU_OMP_THREADS_BIND": "4|5"}]
    assert placements(["-tp", "2"], 2, gpus=4) == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]


def test_gpus_already_narrowed_by_the_environment_keep_their_names(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert placements(["--max-num-seqs", "8"], 2, gpus=4) == [{"CUDA_VISIBLE_DEVICES": "4"},
                                                              {"CUDA_VISIBLE_DEVICES": "5"}]


def test_more_devices_than_the_machine_has_is_refused_before_a_boot():
    with pytest.raises(ConfigError, match=r"2 replicas of 2 rank\(s\) each need 4 CPU cores, one a rank; this machine "
                                          r"gives 2 \(0-1\): pass fewer --replicas"):
        placements(["--data-parallel-size", "2"], 2, cores=[0, 1], gpus=0)
    with pytest.raises(ConfigError, match="need 4 GPUs; this machine has 2"):
        placements(["--tensor-parallel-size", "2"], 2, gpus=2)
