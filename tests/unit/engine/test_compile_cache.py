"""engine/compile_cache.py: one cache per vLLM release and model in the user's cache directory,
shared by every boot of a study (and by later studies of the same model), never across releases
or models; node-local off the driver's machine; an operator's own cache variables win."""

import os
from pathlib import Path

from optimizer.config.schema import build_config
from optimizer.driver.launch import make_spec
from optimizer.driver.plan import prepare
from optimizer.engine.compile_cache import (
    CACHE_ROOT,
    INDUCTOR_DIR,
    cache_dir,
    default_root,
    node_cache_dir,
    share_model_infos,
    with_cache,
)
from optimizer.engine.vllm_version import installed_vllm


def test_one_directory_per_release_and_model():
    a = cache_dir("/art", "models/tiny-llama", "0.32.0")
    assert a == cache_dir("/art", "models/tiny-llama", "0.32.0")
    assert a.parent.name == "vllm-0.32.0" and a.name.startswith("tiny-llama-") and a.parents[1] == Path("/art")
    assert cache_dir("/art", "models/tiny-llama", "0.33.0") != a  # another release
    assert cache_dir("/art", "other/tiny-llama", "0.32.0") != a  # same name, another model
    assert cache_dir("/art", "meta-llama/Llama-3.1-8B", "0.32.0+cpu").parent.name == "vllm-0.32.0_cpu"
    assert cache_dir("/art", "m", None).parent.name == "vllm-unknown"


def test_a_boot_off_the_drivers_machine_uses_node_local_scratch():
    path = "/art/compile-cache/vllm-0.32.0/tiny-llama-abc"
    assert node_cache_dir(path, "driver", host="driver") == Path(path)
    assert node_cache_dir(path, "", host="worker") == Path(path)  # no driver host: this machine
    local = node_cache_dir(path, "driver", host="worker")
    assert local != Path(path) and local.name.startswith("tiny-llama-abc-")
    assert local == node_cache_dir(path, "driver", host="worker2")  # keyed by the cache, not the node
    assert node_cache_dir(path.replace("0.32.0", "0.33.0"), "driver", host="worker") != local


def test_the_operators_own_variables_win():
    d = Path("/c")
    assert with_cache({}, d, inherited={}) == {CACHE_ROOT: "/c", INDUCTOR_DIR: "/c/inductor"}
    assert with_cache({CACHE_ROOT: "/mine"}, d, inherited={}) == {CACHE_ROOT: "/mine", INDUCTOR_DIR: "/c/inductor"}
    assert with_cache({"X": "1"}, d, inherited={INDUCTOR_DIR: "/tmp/i"}) == {"X": "1", CACHE_ROOT: "/c"}


def _plan(tmp_path, tiny_model, **engine):
    return prepare(build_config({
        "study_name": "cc", "storage": f"sqlite:///{tmp_path / 'trials.db'}",
        "artifacts_dir": str(tmp_path / "artifacts"), "model": {"path": str(tiny_model)},
        "space": {"max-num-seqs": {"low": 4, "high": 8}}, "engine": engine,
        "workload": {"requests": 4, "warmup_requests": 1, "short_input": [8, 16], "long_input": [32, 64],
                     "output": [4, 8]},
    }))


def test_the_cache_lives_in_the_users_cache_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_root() == tmp_path / "xdg" / "vllm-optimizer" / "compile-cache"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_root() == tmp_path / "home" / ".cache" / "vllm-optimizer" / "compile-cache"


def test_every_boot_of_a_study_gets_the_same_cache(tmp_path, tiny_model, monkeypatch):
    monkeypatch.delenv(CACHE_ROOT, raising=False)
    monkeypatch.delenv(INDUCTOR_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    plan = _plan(tmp_path, tiny_model)
    trial, remeasure = make_spec(0, plan, {"max-num-seqs": 4}, "trial-0"), make_spec(7, plan, {"max-num-seqs": 8}, "confirm/7")
    expected = cache_dir(tmp_path / "xdg" / "vllm-optimizer" / "compile-cache", plan.model.source, installed_vllm())
    assert trial.compile_cache == remeasure.compile_cache == str(expected)
    env = trial.server_env()
    assert env[CACHE_ROOT] == str(expected) and env[INDUCTOR_DIR] == str(expected / "inductor")
    assert env["VLLM_SERVER_DEV_MODE"] == "1"  # the spec's own variables are kept
    assert (expected / "modelinfos").resolve() == expected.parent / "modelinfos"  # shared with the release's models
    # vLLM's dev endpoints only where the prefix cache is on (the trial resets it after warm-up)
    uncached = make_spec(1, plan, {"max-num-seqs": 4, "enable-prefix-caching": False}, "trial-1")
    assert "--no-enable-prefix-caching" in uncached.vllm_args and "VLLM_SERVER_DEV_MODE" not in uncached.server_env()


def test_a_config_can_turn_it_off_or_name_its_own(tmp_path, tiny_model, monkeypatch):
    monkeypatch.delenv(CACHE_ROOT, raising=False)
    off = make_spec(0, _plan(tmp_path, tiny_model, compile_cache=False), {"max-num-seqs": 4}, "t")
    assert off.compile_cache == "" and CACHE_ROOT not in off.server_env()
    own = make_spec(0, _plan(tmp_path, tiny_model, env={CACHE_ROOT: "/srv/cache"}), {"max-num-seqs": 4}, "t")
    assert own.server_env()[CACHE_ROOT] == "/srv/cache"
    assert not Path("/srv/cache").exists()  # the operator's own root is left as it is


def test_the_model_class_inspection_is_shared_by_the_models_of_a_release(tmp_path):
    a, b = cache_dir(tmp_path, "models/a", "0.32.0"), cache_dir(tmp_path, "models/b", "0.32.0")
    share_model_infos(a)
    (a / "modelinfos" / "llama-LlamaForCausalLM.json").write_text("{}")  # as vLLM writes it, through the link
    share_model_infos(b)
    share_model_infos(b)  # again: the link is kept
    assert (b / "modelinfos" / "llama-LlamaForCausalLM.json").read_text() == "{}"
    assert (b / "modelinfos").is_symlink() and os.readlink(b / "modelinfos") == os.path.join("..", "modelinfos")
    other = cache_dir(tmp_path, "models/a", "0.33.0")
    share_model_infos(other)
    assert not (other / "modelinfos" / "llama-LlamaForCausalLM.json").exists()  # never across releases
    mine = tmp_path / "mine"
    (mine / "modelinfos").mkdir(parents=True)  # a directory of its own (a cache made before): left alone
    share_model_infos(mine)
    assert not (mine / "modelinfos").is_symlink()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    share_model_infos(blocked / "m")  # cannot be made (a file in the way): nothing raised, vLLM inspects again


def test_aot_artifacts_are_off_on_cpu_only_unless_the_operator_says():
    from optimizer.engine.compile_cache import AOT, device_env
    assert device_env("cpu", {"X": "1"}, inherited={}) == {"X": "1", AOT: "0"}
    assert device_env("gpu", {}, inherited={}) == {}  # vLLM's default on GPUs
    assert device_env("cpu", {AOT: "1"}, inherited={}) == {AOT: "1"}
    assert device_env("cpu", {}, inherited={AOT: "1"}) == {}


def test_a_boot_that_wrote_no_new_cache_entry_is_a_hit(tmp_path):
    from optimizer.engine.compile_cache import cache_entries, cache_state
    env = {INDUCTOR_DIR: str(tmp_path / "inductor")}
    assert cache_entries(env) == 0 and cache_entries({}) is None
    (tmp_path / "inductor" / "fxgraph" / "7e").mkdir(parents=True)
    (tmp_path / "inductor" / "fxgraph" / "7e" / "entry").write_text("x")
    assert cache_entries(env) == 1
    assert cache_state(None, True, 0, 1) == "miss" and cache_state(None, True, 1, 1) == "hit"
    assert cache_state("reload_failed", True, 1, 1) == "reload_failed"  # the log's word wins
    assert cache_state(None, False, 0, 5) is None  # no compile step (eager, or it never got there)
    assert cache_state(None, True, None, None) is None  # the operator's own cache: not counted


def test_node_scratch_is_this_users_own_and_a_planted_one_is_refused(tmp_path):
    import os
    import stat

    import pytest

    from optimizer.engine.compile_cache import node_scratch

    made = node_scratch(tmp_path)
    assert made == tmp_path / f"vllm-optimizer-{os.getuid()}" and stat.S_IMODE(made.stat().st_mode) == 0o700
    assert node_scratch(tmp_path) == made  # reused as it is
    made.chmod(0o777)  # as if someone made it for every user to write into
    with pytest.raises(RuntimeError, match=r"with mode 777: another user may have made it; remove it"):
        node_scratch(tmp_path)
    made.chmod(0o700)
    if os.geteuid() == 0:  # another user's own 0700 directory, made there first
        os.chown(made, 12345, -1)
        with pytest.raises(RuntimeError, match=r"belongs to uid 12345 with mode 700"):
            node_scratch(tmp_path)
    made.rmdir()
    made.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(RuntimeError, match=r"is not a directory \(a link\?\): remove it"):
        node_scratch(tmp_path)
