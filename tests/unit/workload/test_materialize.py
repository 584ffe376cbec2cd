"""workload/materialize.py: a workload file reads back equal, is written once, and refuses tampering."""

import json
import os

import pytest

from optimizer.config.workload_spec import AgentSpec
from optimizer.errors import ConfigError
from optimizer.workload import Vocabulary, Workload, build_workload
from optimizer.workload.materialize import read_workload, write_workload


@pytest.fixture(scope="module")
def workload() -> Workload:
    spec = AgentSpec(seed=5, sessions=4, turns=(2, 4), system_tokens=64, tool_result=(8, 128),
                     arrival={"process": "gamma", "rate": 2.0, "burstiness": 0.5})
    w = build_workload(spec, Vocabulary(4096))
    assert {r.after is None for r in w.requests} == {True, False}  # roots and follow-ups both present
    return w


def test_round_trip_gives_an_equal_workload(tmp_path, workload):
    path = write_workload(workload, tmp_path)
    assert path.parent == tmp_path and workload.content_hash()[:12] in path.name
    back = read_workload(path)
    assert back == workload  # every field: ids, token tuples, offsets, `after`, concurrency, description
    assert back.content_hash() == workload.content_hash()
    assert [r.after for r in back.requests] == [r.after for r in workload.requests]
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_notes_and_closed_loop_round_trip(tmp_path, workload):
    w = Workload("x", workload.requests[:2], (), 3, "two requests", ("5 rows skipped", "note two"))
    assert read_workload(write_workload(w, tmp_path)) == w


def test_second_write_leaves_the_file_alone(tmp_path, workload):
    path = write_workload(workload, tmp_path)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert write_workload(workload, tmp_path) == path
    assert path.stat().st_mtime_ns == 1_000_000_000


def test_tampered_token_is_refused_naming_the_hash(tmp_path, workload):
    path = write_workload(workload, tmp_path)
    lines = path.read_text().splitlines()
    row = json.loads(lines[-1])
    row["prompt_token_ids"][-1] += 1
    lines[-1] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="hash") as err:
        read_workload(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("cut", ["mid-line", "last-line", "empty"])
def test_truncated_file_is_refused(tmp_path, workload, cut):
    path = write_workload(workload, tmp_path)
    text = path.read_text()
    if cut == "mid-line":
        text = text[:len(text) // 2]
    elif cut == "last-line":
        text = "".join(text.splitlines(keepends=True)[:-1])
    else:
        text = ""
    path.write_text(text)
    with pytest.raises(ConfigError, match="workload file"):
        read_workload(path)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it"):
        read_workload(tmp_path / "workload-000000000000.jsonl")


def test_header_without_hash_is_a_config_error(tmp_path, workload):
    path = write_workload(workload, tmp_path)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    del header["hash"]
    path.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    with pytest.raises(ConfigError):
        read_workload(path)
