"""traffic/served_models.py: what a vLLM server admits, read from its `/v1/models` page (the page
vLLM's own ModelList serializer writes), beside the `/metrics` URL the daemon watches."""

import io

from rich.console import Console

from optimizer.config.schema import build_config
from optimizer.traffic.served_models import models_url, served_max_model_len
from tests.unit.page_server import serving_by_path


def vllm_models_page(max_model_len: int) -> bytes:
    from vllm.entrypoints.serve.engine.protocol import ModelCard, ModelList, ModelPermission

    card = ModelCard(id="tiny", root="/models/tiny", max_model_len=max_model_len, permission=[ModelPermission()])
    return ModelList(data=[card]).model_dump_json().encode()


def test_the_models_page_sits_beside_the_metrics_page():
    assert models_url("http://prod:8000/metrics") == "http://prod:8000/v1/models"
    assert models_url("https://lb.example/svc/a/metrics?x=1") == "https://lb.example/svc/a/v1/models"


def test_the_smallest_max_model_len_of_the_servers_is_what_production_admits():
    pages = {"/a/v1/models": (vllm_models_page(8192), 200), "/b/v1/models": (vllm_models_page(4096), 200),
             "/c/v1/models": (b'{"error": "Unauthorized"}', 401), "/d/v1/models": (b"<html>", 200)}
    with serving_by_path(lambda path: pages.get(path, (b"no", 404))) as url:
        assert served_max_model_len([f"{url}/a/metrics"], 5) == (8192, [])
        length, unread = served_max_model_len([f"{url}/{s}/metrics" for s in "abcd"], 5)
    assert length == 4096
    assert unread[0] == f"{url}/c/v1/models answered HTTP 401; check that it is a vLLM server's OpenAI API"
    assert unread[1].startswith(f"{url}/d/v1/models is not a model list")


def test_the_observer_takes_what_the_servers_admit_unless_the_watch_says_it(tmp_path):
    from optimizer.daemon.loop import Daemon
    from tests.unit.traffic.test_scrape import HERE

    page = (HERE / "vllm_metrics_0.txt").read_bytes()
    answer = {"/metrics": (page, 200), "/v1/models": (vllm_models_page(4096), 200)}
    with serving_by_path(lambda path: answer.get(path, (b"no", 404))) as url:
        for watch, admits in (({}, 4096), ({"max_model_len": 2048}, 2048)):
            cfg = build_config({"model": {"path": "/m"}, "artifacts_dir": str(tmp_path), "baseline": {"max-model-len": 1024},
                                "daemon": {"watch": {"vllm_metrics": [f"{url}/metrics"], **watch}}})
            out = io.StringIO()
            d = Daemon(cfg, Console(file=out, width=200), "127.0.0.1", 0, None)
            d.observer.check()
            assert d.observer.admits == admits and d.state.snapshot()["watch"]["admits"] == admits
            assert ("production admits 4,096 tokens a request (max_model_len on /v1/models)" in out.getvalue()) == (not watch)
    # a server that does not say: the baseline's, and the line says why
    with serving_by_path(lambda path: (page, 200) if path == "/metrics" else (b"no", 404)) as url:
        cfg = build_config({"model": {"path": "/m"}, "artifacts_dir": str(tmp_path), "baseline": {"max-model-len": 1024},
                            "daemon": {"watch": {"vllm_metrics": [f"{url}/metrics"]}}})
        out = io.StringIO()
        d = Daemon(cfg, Console(file=out, width=200), "127.0.0.1", 0, None)
        d.observer.check()
    assert d.observer.admits == 1024 and f"production's max-model-len not read: {url}/v1/models answered HTTP 404" in out.getvalue()
