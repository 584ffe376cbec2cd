"""driver/resources.py: trials at once from the cluster's resources (as `ray.nodes()` reports them), and
the refusal of a trial no node can run. The node dicts have the shape Ray 2.60 returns."""

import pytest

from optimizer.driver.resources import (
    NoMatchingResources,
    check_fits,
    cluster_slots,
    node_slots,
    plan_slots,
    ray_options,
    request,
)


def node(alive=True, **resources):
    return {"Alive": alive, "Resources": {"node:10.0.0.1": 1.0, "memory": 1e11, **resources}}


H100 = node(CPU=192.0, GPU=8.0, gpu_h100=8.0, accelerator_type_H100=1.0)
A10 = node(CPU=48.0, GPU=4.0, gpu_a10=4.0)
HEAD = node(CPU=4.0)


def test_one_slot_per_tensor_parallel_group_summed_over_nodes():
    assert cluster_slots([HEAD, H100, H100], request("gpu", 1, 1, "gpu_h100")) == 16
    assert cluster_slots([HEAD, H100, H100], request("gpu", 1, 2, "gpu_h100")) == 8
    assert cluster_slots([HEAD, H100, H100], request("gpu", 1, 8, "gpu_h100")) == 2
    # Groups never straddle nodes: 3 GPUs per trial on 8-GPU nodes leave 2 idle on each.
    assert cluster_slots([H100, H100], request("gpu", 1, 3)) == 4
    # CPUs can be the limit too.
    assert node_slots(H100["Resources"], request("gpu", 48, 1)) == 4


def test_dead_nodes_and_other_gpu_models_do_not_count():
    assert cluster_slots([HEAD, node(alive=False, CPU=192.0, GPU=8.0, gpu_h100=8.0), A10],
                         request("gpu", 1, 1, "gpu_h100")) == 0
    assert cluster_slots([HEAD, A10], request("gpu", 1, 1)) == 4  # no model named: any GPU


def test_never_more_than_the_cluster_has():
    s = plan_slots(32, "gpu", [HEAD, A10], request("gpu", 1, 1))
    assert s.count == 4 and "capped at 4" in s.warning
    assert plan_slots(None, "gpu", [HEAD, A10], request("gpu", 1, 2)).count == 2
    assert plan_slots(1, "gpu", [HEAD, A10], request("gpu", 1, 1)).count == 1


def test_cpu_runs_one_trial_unless_asked_and_warns_when_it_runs_more():
    two_cores = [node(CPU=2.0)]
    one = plan_slots(None, "cpu", two_cores, request("cpu", 2))
    assert one.count == 1 and one.warning == ""
    two = plan_slots(2, "cpu", two_cores, request("cpu", 1))
    assert two.count == 2 and "2 CPU trials at once share 2 cores" in two.warning and "timings" in two.warning
    capped = plan_slots(3, "cpu", two_cores, request("cpu", 1))
    assert capped.count == 2 and capped.warning.startswith("ray.parallel 3 capped at 2")


def test_a_gpu_model_the_cluster_lacks_is_refused_in_one_line():
    with pytest.raises(NoMatchingResources) as err:
        check_fits([HEAD, A10], request("gpu", 1, 1, "gpu_h100"), "the cluster at 10.0.0.1:6379")
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("ray: no node in the cluster at 10.0.0.1:6379 can run a trial asking for CPU=1, GPU=1, "
                           "gpu_h100=1")
    assert "custom resources there: gpu_a10" in line and "set ray.gpu_model" in line


def test_too_many_gpus_per_trial_or_cpus_are_refused_with_the_right_fix():
    with pytest.raises(NoMatchingResources) as err:
        check_fits([HEAD, A10], request("gpu", 1, 8), "the embedded local Ray")
    assert "largest node: CPU=48, GPU=4" in str(err.value) and "tensor-parallel-size" in str(err.value)
    with pytest.raises(NoMatchingResources) as err:
        check_fits([node(CPU=2.0)], request("gpu", 1, 1), "the embedded local Ray")
    assert "GPU=0" in str(err.value)
    check_fits([HEAD, A10], request("gpu", 1, 4, "gpu_a10"), "x")  # fits: no error


def test_ray_options_carry_the_custom_resource():
    assert ray_options(request("gpu", 2, 4, "gpu_h100")) == {"num_cpus": 2, "num_gpus": 4,
                                                             "resources": {"gpu_h100": 4}}
    assert ray_options(request("cpu", 1)) == {"num_cpus": 1}


def test_slots_are_counted_for_the_largest_tensor_parallel_size_the_space_can_pick():
    from types import SimpleNamespace

    from optimizer.config.schema import RaySpec
    from optimizer.config.space import Dimension, Knob
    from optimizer.driver.resources import largest_request

    tp = Dimension(Knob("tensor-parallel-size", "categorical"), choices=(1, 2, 4))
    plan = SimpleNamespace(device=SimpleNamespace(kind="gpu"), cfg=SimpleNamespace(ray=RaySpec(gpu_model="gpu_h100"),
                           baseline={}), space=SimpleNamespace(dims=(tp,)))
    largest = largest_request(plan)
    assert largest == {"CPU": 1, "GPU": 4, "gpu_h100": 4}
    assert plan_slots(None, "gpu", [HEAD, H100], largest).count == 2  # two 4-GPU groups on one 8-GPU node


def _cpu_plan(**space):
    from types import SimpleNamespace

    from optimizer.config.schema import RaySpec
    from optimizer.config.space import Dimension, Knob

    dims = tuple(Dimension(Knob(name.replace("_", "-"), "categorical"), choices=c) for name, c in space.items())
    return SimpleNamespace(device=SimpleNamespace(kind="cpu"), cfg=SimpleNamespace(ray=RaySpec(trial_cpus=1),
                           baseline={}), space=SimpleNamespace(dims=dims))


def test_a_cpu_trial_asks_for_a_core_per_rank_and_a_combination_no_node_holds_is_left_to_the_trial():
    from optimizer.driver.resources import check_sizes, largest_request, trial_request

    plan = _cpu_plan(tensor_parallel_size=(1, 2), data_parallel_size=(1, 2))
    assert trial_request(plan, {"tensor-parallel-size": 2, "data-parallel-size": 2}) == {"CPU": 4.0}
    assert trial_request(plan, {}) == {"CPU": 1.0}  # ray.trial_cpus, when it is more than the ranks
    two = [node(CPU=2.0)]
    check_sizes(plan, two, "here")  # TP 2 and DP 2 each fit; TP 2 x DP 2 is pruned before its boot
    assert largest_request(plan, two) == {"CPU": 2.0} and largest_request(plan) == {"CPU": 4.0}
    with pytest.raises(NoMatchingResources, match=r"^space\.data-parallel-size: 4 ranks alone fit no node; ray: no "
                                                  r"node in here can run a trial asking for CPU=4 \(largest node: CPU=2;"):
        check_sizes(_cpu_plan(data_parallel_size=(1, 4)), two, "here")


def test_a_trial_with_more_ranks_than_any_node_has_is_named_before_its_boot(monkeypatch):
    from optimizer.driver import resources

    monkeypatch.setattr(resources.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(resources.ray, "nodes", lambda: [node(CPU=2.0), node(alive=False, CPU=64.0)])
    plan = _cpu_plan(tensor_parallel_size=(1, 2), data_parallel_size=(1, 2))
    assert resources.too_big(plan, {"tensor-parallel-size": 2}) == ""
    assert resources.too_big(plan, {"tensor-parallel-size": 2, "data-parallel-size": 2}) == (
        "TP 2 x DP 2 runs 4 ranks, one CPU each; the largest node has 2 CPUs")


def test_ray_resources_pin_cpu_and_gpu_trials_to_the_nodes_that_have_them():
    pool = node(CPU=8.0, tuning_pool=1.0)
    req = request("cpu", 1, custom={"tuning_pool": 1})
    assert req == {"CPU": 1.0, "tuning_pool": 1.0}
    assert ray_options(req) == {"num_cpus": 1.0, "resources": {"tuning_pool": 1.0}}
    assert cluster_slots([HEAD, pool], req) == 1  # the head has CPUs but not the pool
    assert request("gpu", 1, 2, "gpu_h100", {"gpu_h100": 1, "rack_a": 0.5}) == {
        "CPU": 1.0, "GPU": 2.0, "gpu_h100": 3.0, "rack_a": 0.5}
    with pytest.raises(NoMatchingResources) as err:
        check_fits([HEAD], req, "the cluster at 10.0.0.1:6379")
    assert "tuning_pool=1" in str(err.value) and "ray.resources" in str(err.value)


@pytest.mark.parametrize("bad, said", [({"GPU": 1}, "'GPU' is not a custom resource name"),
                                       ({"pool": 0}, "'pool': 0 is not a positive amount"),
                                       ({"1bad": 1}, "'1bad' is not a custom resource name")])
def test_ray_resources_refuse_standard_names_and_non_positive_amounts(bad, said):
    from pydantic import ValidationError

    from optimizer.config.schema import RaySpec

    with pytest.raises(ValidationError) as err:
        RaySpec(resources=bad)
    assert said in str(err.value)


def _memory_plan(parallel, baseline=None, extra=(), enqueue=(), dims=()):
    from types import SimpleNamespace

    from optimizer.config.schema import EngineSpec, RaySpec
    from optimizer.engine.device import GIB, NodeMemory

    return SimpleNamespace(
        device=SimpleNamespace(kind="cpu", memory=NodeMemory(int(20 * GIB), int(16 * GIB))),
        cfg=SimpleNamespace(ray=RaySpec(parallel=parallel), baseline=baseline or {}, enqueue=list(enqueue),
                            engine=EngineSpec(extra_args=list(extra))),
        space=SimpleNamespace(dims=tuple(dims)))


def test_cpu_trials_at_once_must_fit_in_the_nodes_memory_together():
    from optimizer.config.space import Dimension, Knob
    from optimizer.driver.resources import check_memory_together
    from optimizer.errors import ConfigError

    two = [node(CPU=2.0)]
    # 20 GiB node, 16 available, 3 GiB of it kept free (2 GiB + 5% of the machine, as the default range
    # keeps): two trials at 0.32 claim 12.8 GiB (fit); at 0.33, 13.2 (refused, 0.32 named).
    check_memory_together(_memory_plan(2, {"gpu-memory-utilization": 0.32}), two)
    with pytest.raises(ConfigError, match=r"^ray\.parallel: 2 trials at once, 1 rank\(s\) each at gpu-memory-"
                                          r"utilization 0\.33 \(the baseline\), claim 13\.2 GiB .*; 16\.0 GiB of 20\.0 is "
                                          r"available, and 3\.0 GiB of it stays free for the machine: keep every "
                                          r"gpu-memory-utilization at or below 0\.32, or run fewer trials at once$"):
        check_memory_together(_memory_plan(2, {"gpu-memory-utilization": 0.33}), two)
    # The largest a trial can take counts: an enqueued trial's own, the space's high, or extra_args over all.
    util = Dimension(Knob("gpu-memory-utilization", "float"), 0.05, 0.5)
    with pytest.raises(ConfigError, match=r"0\.5 \(the space's high\)"):
        check_memory_together(_memory_plan(2, {"gpu-memory-utilization": 0.1}, dims=[util]), two)
    with pytest.raises(ConfigError, match=r"0\.6 \(enqueue\.0\)"):
        check_memory_together(_memory_plan(2, {"gpu-memory-utilization": 0.1},
                                           enqueue=[{"gpu-memory-utilization": 0.6}]), two)
    # An enqueued trial that leaves the fraction out runs the sampler's draw or the baseline's value.
    check_memory_together(_memory_plan(2, {"gpu-memory-utilization": 0.1}, enqueue=[{"max-num-seqs": 16}]), two)
    check_memory_together(_memory_plan(2, {"gpu-memory-utilization": 0.6}, extra=["--gpu-memory-utilization", "0.3"]), two)
    check_memory_together(_memory_plan(2, {"gpu-memory-utilization": 0.6}, extra=["--gpu-memory-utilization=0.3"]), two)
    with pytest.raises(ConfigError, match=r"^engine\.extra_args: --gpu-memory-utilization needs a fraction"):
        check_memory_together(_memory_plan(2, extra=["--gpu-memory-utilization", "lots"]), two)
    # vLLM's own default (0.92) when nothing sets it; one trial at a time is vLLM's own check at start.
    with pytest.raises(ConfigError, match=r"0\.92 \(the baseline\)"):
        check_memory_together(_memory_plan(2), two)
    check_memory_together(_memory_plan(None, {"gpu-memory-utilization": 0.9}), two)
    check_memory_together(_memory_plan(1, {"gpu-memory-utilization": 0.9}), two)
    # So many trials that none fits beside the headroom: only fewer trials is offered.
    with pytest.raises(ConfigError, match=r"stays free for the machine: run fewer trials at once$"):
        check_memory_together(_memory_plan(128, {"gpu-memory-utilization": 0.01}), [node(CPU=128.0)])


def test_the_default_memory_range_is_shared_by_the_trials_at_once():
    from optimizer.config.model_info import ModelInfo
    from optimizer.config.space import cpu_memory_range
    from optimizer.engine.device import GIB, Device, NodeMemory

    model = ModelInfo("tiny", layers=8, kv_heads=8, head_dim=64, hidden=512, intermediate=1024,
                      vocab_size=4096, max_positions=65536, dtype="bfloat16")
    device = Device("cpu", 0, NodeMemory(int(20 * GIB), int(16 * GIB)))
    one, two = cpu_memory_range(device, model, 2048), cpu_memory_range(device, model, 2048, at_once=2)
    assert one[0] == two[0] and two[1] < one[1] / 2 + 0.01
    assert 2 * two[1] * 20 * GIB < 16 * GIB  # two trials at the high end fit together
