"""Run directories are private and made safely (issue 15): 0700 folders, 0600 files, no writing
through a symlink planted inside, no directory of another user, no reuse of a used directory."""

from __future__ import annotations

import json
import math
import os
import stat

import pytest

from ddpdoctor.errors import UsageError
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.rundir import RunDir, write_json_atomic
from ddpdoctor.runtime.writer import EventWriter


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_folders_are_0700_and_files_0600_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        run = RunDir.create(tmp_path / "run")
        writer = EventWriter(run.events_file(0))
        writer.write({"v": 1, "kind": "hello", "argv": ["train.py", "--token", "secret"]})
        writer.close()
        write_json_atomic(run.run_json, {"argv": ["secret"]})
    finally:
        os.umask(old)
    for folder in (run.path, run.events_dir, run.logs_dir, run.nccl_dir, run.stacks_dir):
        assert mode(folder) == 0o700, folder
    assert mode(run.events_file(0)) == 0o600
    assert mode(run.run_json) == 0o600


def test_an_existing_open_directory_of_ours_is_made_private(tmp_path):
    target = tmp_path / "run"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    RunDir.create(target)
    assert mode(target) == 0o700


def test_a_symlinked_folder_inside_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = tmp_path / "run"
    target.mkdir()
    (target / "events").symlink_to(elsewhere)
    with pytest.raises(UsageError, match="events is a symlink: refusing to write through it"):
        RunDir.create(target)


def test_the_event_writer_never_appends_through_a_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    run = RunDir.create(tmp_path / "run")
    run.events_file(0).symlink_to(victim)
    writer = EventWriter(run.events_file(0))
    writer.write({"v": 1, "kind": "hello"})  # fails quietly (one warning), training goes on
    writer.close()
    assert victim.read_text() == "root's file\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_directory_owned_by_another_user_is_refused(tmp_path):
    target = tmp_path / "theirs"
    target.mkdir()
    os.chown(target, 65534, 65534)
    with pytest.raises(UsageError, match=r"owned by another user \(uid 65534\)"):
        RunDir.check_fresh(target)
    with pytest.raises(UsageError, match="owned by another user"):
        RunDir.create(target)


def test_a_used_run_directory_is_refused_with_the_fix(tmp_path):
    target = tmp_path / "run"
    RunDir.check_fresh(target)  # not there yet: fine
    target.mkdir()
    RunDir.check_fresh(target)  # empty: fine
    RunDir.create(target)
    (target / "diagnosis.json").write_text("{}")
    with pytest.raises(UsageError) as caught:
        RunDir.check_fresh(target)
    assert f"run directory {target} is not empty" in str(caught.value)
    assert "choose a new --run-dir" in str(caught.value)


def test_nodes_of_one_job_share_a_directory_but_a_node_never_runs_twice_in_it(tmp_path):
    target = tmp_path / "run"
    run = RunDir.create(target)
    write_json_atomic(run.run_json, {"nnodes": 2})  # node 0 was first
    RunDir.check_fresh(target, node_rank=1)
    run.node_dir(1).mkdir(parents=True)
    with pytest.raises(UsageError, match="already holds node 1's part of a run"):
        RunDir.check_fresh(target, node_rank=1)
    RunDir.check_fresh(target, node_rank=0)


def test_node_0s_run_json_wins_whichever_node_writes_first(tmp_path):
    path = tmp_path / "run.json"
    # A later node finds the place empty and fills it; node 0 then replaces it.
    assert write_json_atomic(path, {"node_rank": 1}, replace=False) is True
    assert write_json_atomic(path, {"node_rank": 0}) is True
    # A node that comes after node 0 keeps node 0's description.
    assert write_json_atomic(path, {"node_rank": 2}, replace=False) is False
    assert json.loads(path.read_text()) == {"node_rank": 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no temp file left


def test_json_written_is_always_valid_json(tmp_path):
    path = tmp_path / "d.json"
    write_json_atomic(path, {"loss": math.nan, "t": [math.inf, 1.5], "n": {"x": -math.inf}})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"loss": None, "t": [None, 1.5], "n": {"x": None}}
    assert json.loads(jsontext.dumps({"a": math.nan})) == {"a": None}


def test_events_with_a_nan_are_valid_json(tmp_path):
    run = RunDir.create(tmp_path / "run")
    writer = EventWriter(run.events_file(0))
    writer.write({"v": 1, "kind": "metrics", "values": {"loss": math.nan}})
    writer.close()
    line = run.events_file(0).read_text().strip()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"invalid JSON {c}"))


def test_ddpdoctors_folders_made_on_the_way_are_0700_whatever_the_umask(tmp_path):
    from ddpdoctor.protocol.fr_requests import answers_dir
    from ddpdoctor.protocol.rundir import make_private_dirs

    old = os.umask(0o022)
    try:
        run = RunDir.create(tmp_path / "run")
        write_json_atomic(run.requests_dir / "r.json", {})
        write_json_atomic(answers_dir(run) / "rank-0.json", {})
        make_private_dirs(run.path / "checkpoint" / "deeper")
    finally:
        os.umask(old)
    for folder in (run.requests_dir, answers_dir(run), run.path / "checkpoint"):
        assert mode(folder) == 0o700, folder
    assert mode(run.path / "checkpoint" / "deeper") == 0o700


def test_torchruns_log_folders_and_files_are_made_private_once_found(tmp_path):
    from ddpdoctor.monitor.follow.tail import RunTailer

    run = RunDir.create(tmp_path / "run")
    attempt = run.logs_dir / "vm" / "abc_1" / "attempt_0" / "0"
    old = os.umask(0o022)
    try:
        attempt.mkdir(parents=True)
        (attempt / "stderr.log").write_text("hello\n")
    finally:
        os.umask(old)
    assert mode(attempt / "stderr.log") == 0o644
    RunTailer(run).poll(0.0)
    assert mode(attempt / "stderr.log") == 0o600
    for folder in (attempt, attempt.parent, attempt.parent.parent, run.logs_dir / "vm"):
        assert mode(folder) == 0o700, folder
