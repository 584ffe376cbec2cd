"""The study's start-up totals: summed over the trials whose log was read, with the compile cache."""

from types import SimpleNamespace

from optimizer.report.startup import startup_text, startup_totals


def _trial(steps: dict | None, cache: str | None = None):
    attrs = {"startup": {"steps": steps, "compile_cache": cache, "ready": True}} if steps is not None else {}
    return SimpleNamespace(user_attrs=attrs)


def test_steps_are_summed_over_the_trials_read_and_the_cache_counted():
    trials = [_trial({"import": 10.0, "compile": 58.0, "kv_cache": 2.0}, "miss"),
              _trial({"import": 11.0, "compile": 25.0, "kv_cache": 1.0}, "reload_failed"),
              _trial({"import": 10.0, "kv_cache": 2.0}),  # eager: no compile
              _trial(None)]  # pruned by the precheck: never booted
    totals = startup_totals(trials)
    assert totals == {"boots": 3, "seconds": 119.0, "steps": {"import": 31.0, "compile": 83.0, "kv_cache": 5.0},
                      "cache": {"miss": 1, "reload_failed": 1}}
    assert startup_text(totals) == ("Start-up: 3 boot(s), 119 s in all (compile 83 s, import 31 s, kv cache 5 s); "
                                    "the compile cache missed 1x, failed to load 1x")


def test_no_start_up_read_gives_no_line():
    assert startup_totals([_trial(None)]) is None
    assert startup_text(startup_totals([_trial({"config": 3.0})])) == "Start-up: 1 boot(s), 3 s in all (config 3 s)"
