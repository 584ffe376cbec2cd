"""The next generation fitted to what production admits (daemon/admission.py): a baseline below it
raised, a space below it widened, rejections past it widening the space further, and a
--max-model-len pinned in engine.extra_args left alone and named."""

from optimizer.config.schema import build_config
from optimizer.daemon.admission import admitting, widened


def cfg(**over):
    return build_config({"model": {"path": "/m"}, **over})


def test_without_what_production_admits_nothing_changes():
    c = cfg(baseline={"max-model-len": 2048})
    assert admitting(c, None) == (c, [])


def test_a_baseline_below_what_production_admits_is_raised_and_said():
    out, notes = admitting(cfg(baseline={"max-model-len": 4096, "max-num-seqs": 8}), 8192)
    assert out.baseline == {"max-model-len": 8192, "max-num-seqs": 8}
    assert notes == ["baseline max-model-len raised from 4,096 to 8,192: production admits 8,192 tokens a request "
                     "and the observed lengths reach it"]
    same, notes = admitting(cfg(baseline={"max-model-len": 16384}), 8192)
    assert same.baseline == {"max-model-len": 16384} and notes == []


def test_a_space_below_what_production_admits_reaches_it():
    out, notes = admitting(cfg(space={"max-model-len": {"low": 1024, "high": 4096}}), 8192)
    assert (out.space["max-model-len"].low, out.space["max-model-len"].high) == (1024, 8192)
    assert notes == ["space.max-model-len high widened from 4,096 to 8,192: production admits it"]
    out, notes = admitting(cfg(space={"max-model-len": {"choices": [2048, 4096]}}), 8192)
    assert out.space["max-model-len"].choices == [2048, 4096, 8192] and "choices widened with 8,192" in notes[0]
    # a space that does not name the knob: nothing to widen unless production rejected requests
    out, notes = admitting(cfg(space={"max-num-seqs": {"low": 1, "high": 8}}), 8192)
    assert "max-model-len" not in out.space and notes == []


def test_rejections_past_what_production_admits_widen_the_space_to_twice_it():
    reach = widened(8192, 65536)
    assert reach == 16384 and widened(8192, 10000) == 10000
    out, notes = admitting(cfg(space={"max-num-seqs": {"low": 1, "high": 8}}), 8192, reach)
    assert (out.space["max-model-len"].low, out.space["max-model-len"].high) == (8192, 16384)
    assert notes == ["space.max-model-len added, 8,192 to 16,384: production rejected requests that look longer "
                     "than it admits"]
    out, notes = admitting(cfg(space={"max-model-len": {"low": 2048, "high": 8192}}), 8192, reach)
    assert out.space["max-model-len"].high == 16384 and "from 8,192 to 16,384" in notes[0]
    # the default space already searches max-model-len up to the model's limit
    out, notes = admitting(cfg(), 8192, reach)
    assert out.space == {} and notes == []


def test_a_max_model_len_pinned_in_extra_args_is_left_alone_and_named():
    pinned = cfg(engine={"extra_args": ["--max-model-len", "4096"]}, baseline={"max-num-seqs": 4})
    out, notes = admitting(pinned, 4096, widened(4096, 65536))
    assert out == pinned
    assert notes == ["engine.extra_args fixes --max-model-len at 4096: not widened to admit longer requests; "
                     "move it to baseline to let the daemon widen it"]
    assert admitting(pinned, 4096) == (pinned, [])
    assert admitting(cfg(engine={"extra_args": ["--max-model-len=2048"]}), 4096)[1][0].startswith(
        "engine.extra_args fixes --max-model-len at 2048")


def test_the_daemon_plans_a_rejecting_window_with_the_baseline_raised_and_the_space_widened(tmp_path, tiny_model):
    """Production admits 2,048 tokens (read from its servers); the window's served prompts reach
    ~1,900 of them and 40 requests were answered 4xx. The next generation runs: its workload's
    lengths are cut to 2,048, its baseline raised from 1,024 to 2,048, its space's high to 2,048 and then 4,096, and
    the notes are printed and stamped."""
    import io
    from dataclasses import replace

    from rich.console import Console

    from optimizer.daemon.loop import Daemon
    from optimizer.traffic import window as window_mod

    from tests.unit.daemon.test_observing import window

    c = build_config({"model": {"path": str(tiny_model)}, "artifacts_dir": str(tmp_path),
                      "storage": f"sqlite:///{tmp_path / 'trials.db'}", "baseline": {"max-model-len": 1024},
                      "space": {"max-num-seqs": {"low": 1, "high": 8}, "max-model-len": {"low": 512, "high": 1024}},
                      "daemon": {"watch": {"prometheus": "http://p", "window_s": 10, "requests": 40}}})
    out = io.StringIO()
    d = Daemon(c, Console(file=out, width=300), "127.0.0.1", 0, None)
    d.observer.admits = 2048
    path = window_mod.write(replace(window(4), rejected_4xx=40.0), tmp_path / "window-1.json")
    plan, _ = d._plan(2, path, [])
    assert plan.workload.longest_request() <= 2048
    assert plan.cfg.baseline["max-model-len"] == 2048
    dim = next(x for x in plan.space.dims if x.knob.name == "max-model-len")
    assert dim.high == 4096
    assert "generation 2: baseline max-model-len raised from 1,024 to 2,048" in out.getvalue()
    assert "generation 2: space.max-model-len high widened from 2,048 to 4,096: production rejected" in out.getvalue()
    assert "space.max-model-len high widened from 1,024 to 2,048: production admits it" in d._admission[1]
    assert len(d._admission) == 3
    # the same window without rejections: the baseline still admits production's lengths, the space reaches them
    quiet, _ = d._plan(3, window_mod.write(window(4), tmp_path / "window-2.json"), [])
    assert next(x for x in quiet.space.dims if x.knob.name == "max-model-len").high == 2048
