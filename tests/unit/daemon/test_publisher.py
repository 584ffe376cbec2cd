"""daemon/publisher.py: a decision is recorded on the study; a published one is written, served at
/recommendation with its info metric, and served again by a restarted daemon."""

import io

import optuna
import yaml
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from optimizer.config.daemon_spec import PublishSpec
from optimizer.config.schema import build_config
from optimizer.daemon.metrics_page import prometheus_text
from optimizer.daemon.publisher import Publisher
from optimizer.daemon.status_api import StatusState
from tests.unit.driver.test_minimal import finished_study

CFG = build_config({"model": {"path": "/m"}})


def test_a_published_recommendation_is_written_served_and_restored(tmp_path):
    state, out = StatusState(), io.StringIO()
    path = tmp_path / "vllm.yaml"
    study = finished_study()
    record = Publisher(PublishSpec(path=str(path)), state, Console(file=out)).publish(study, CFG, "/m", 2)
    assert record["published"] and record["path"] == str(path)
    assert yaml.safe_load(path.read_text()) == record["recommendation"]["config"]
    assert study.user_attrs["publish"]["published"] and "published generation 2's recommendation" in out.getvalue()
    snap = state.snapshot()
    assert snap["recommendation"]["flags"] == record["recommendation"]["flags"]
    assert snap["publish"]["decision"]["reason"] == record["reason"]
    info = {s.name: s for f in text_string_to_metric_families(prometheus_text(snap)) for s in f.samples}
    assert info["vllm_optimizer_recommendation_info"].labels["flags"] == " ".join(record["recommendation"]["flags"])
    assert info["vllm_optimizer_recommendation_info"].labels["generation"] == "2"
    assert info["vllm_optimizer_recommendation_gain_ratio"].value == record["recommendation"]["gain"]["ratio"]

    again = StatusState()
    Publisher(PublishSpec(), again, Console(file=io.StringIO())).restore(
        [("s", {}), ("s-g2", dict(study.user_attrs)), ("other-g9", dict(study.user_attrs))], "s")
    assert again.snapshot()["recommendation"] == snap["recommendation"]


def test_a_recommendation_that_misses_the_gate_is_recorded_with_why_and_not_written(tmp_path):
    state, path = StatusState(), tmp_path / "vllm.yaml"
    study = finished_study()
    strict = build_config({"model": {"path": "/m"}, "daemon": {"publish": {"min_gain": 50}}})
    record = Publisher(strict.daemon.publish.model_copy(update={"path": str(path)}), state,
                       Console(file=io.StringIO())).publish(study, strict, "/m", 1)
    assert not record["published"] and "below daemon.publish.min_gain" in record["reason"]
    assert not path.exists() and "recommendation" not in state.snapshot()
    assert study.user_attrs["publish"]["reason"] == record["reason"]


def test_a_generation_already_decided_is_not_published_again_on_resume(tmp_path):
    state = StatusState()
    study = finished_study()
    sent = []
    first = Publisher(PublishSpec(path=str(tmp_path / "vllm.yaml")), state, Console(file=io.StringIO()))
    first.publish(study, CFG, "/m", 1)
    (tmp_path / "vllm.yaml").unlink()
    again = Publisher(PublishSpec(path=str(tmp_path / "vllm.yaml"), webhook="http://127.0.0.1:9/hook"), StatusState(),
                      Console(file=io.StringIO()))
    again.webhook.send = sent.append
    record = again.publish(study, CFG, "/m", 1)  # the restarted daemon resumes the finished generation
    assert record["published"] and sent == [] and not (tmp_path / "vllm.yaml").exists()


def test_restore_reads_only_this_study_s_generations():
    study = finished_study()
    Publisher(PublishSpec(), StatusState(), Console(file=io.StringIO())).publish(study, CFG, "/m", 1)
    state = StatusState()
    Publisher(PublishSpec(), state, Console(file=io.StringIO())).restore([("s-gpu", dict(study.user_attrs))], "s")
    assert "recommendation" not in state.snapshot()


def test_a_generation_that_measured_more_trials_since_its_decision_is_decided_again(tmp_path):
    study = finished_study()
    Publisher(PublishSpec(), StatusState(), Console(file=io.StringIO())).publish(study, CFG, "/m", 1)
    first = study.user_attrs["publish"]
    t = study.ask()  # n_trials raised: the resumed generation measures one more
    t.set_user_attr("metrics", {})
    study.tell(t, state=optuna.trial.TrialState.PRUNED)
    again = Publisher(PublishSpec(path=str(tmp_path / "vllm.yaml")), StatusState(), Console(file=io.StringIO()))
    record = again.publish(study, CFG, "/m", 1)
    assert record["trials"] == first["trials"] + 1 and record["decided_at"] > first["decided_at"]
    assert (tmp_path / "vllm.yaml").exists()
