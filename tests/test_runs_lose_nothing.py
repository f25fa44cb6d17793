"""Runs that lose nothing: whole JSONL records, sealed checkpoints, resumes that continue every
log at the checkpoint's iteration, an earlier run's folder left alone until the new run is
known to start, ``--check`` that builds what the run will build, and clear errors on damaged
input. The slow test kills real ``draco-gym train`` processes (Ray and Tune included) with
SIGKILL, at a point a hook holds them at, and resumes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from draco_gym.algos.checkpoints import (MARKER, CheckpointError, copy_checkpoint, install, newest_complete,
                                         problems, require_complete, resume_point, seal, staging_dir)
from draco_gym.algos.run_folder import continue_logs
from draco_gym.cli import main
from draco_gym.records import RecordError, RecordReader, append_records, read_records, write_json

TESTS = Path(__file__).resolve().parent


# -- JSONL records ------------------------------------------------------------------------------


def test_a_torn_last_line_is_skipped_and_counted_a_damaged_one_is_named(tmp_path):
    log = tmp_path / "metrics.jsonl"
    assert append_records(log, [{"training_iteration": 1}, {"training_iteration": 2}]) == 2
    assert log.read_bytes() == b'{"training_iteration": 1}\n{"training_iteration": 2}\n'
    with open(log, "ab") as fh:
        fh.write(b'{"training_iteration": 3, "env_runners/episode_ret')  # the machine died mid-write
    rows, torn = read_records(log)
    assert [r["training_iteration"] for r in rows] == [1, 2] and torn == 1

    # The next record does not glue onto the torn one: the torn bytes are moved aside first.
    append_records(log, [{"training_iteration": 3}])
    rows, torn = read_records(log)
    assert [r["training_iteration"] for r in rows] == [1, 2, 3] and torn == 0
    (kept,) = (tmp_path / "set-aside").glob("torn-*/metrics.jsonl")
    assert kept.read_bytes() == b'{"training_iteration": 3, "env_runners/episode_ret'

    # A finished line that is not a record is damage, not a torn write: named, line and cause.
    with open(log, "ab") as fh:
        fh.write(b'\x89PNG\r\n\x1a\n\x00\x00\n')
    with pytest.raises(RecordError, match=r"metrics.jsonl line 4 is not UTF-8 text"):
        read_records(log)
    log.write_bytes(b'{"a": 1}\n[1, 2]\n')
    with pytest.raises(RecordError, match="line 2 is not a JSON object"):
        list(RecordReader(log))


def test_each_record_is_one_write_of_a_whole_line(tmp_path, monkeypatch):
    writes = []
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(bytes(data)) or real(fd, data))
    records = [{"i": i, "text": "x" * 200_000} for i in range(3)]
    append_records(tmp_path / "rollouts.jsonl", records)
    assert [json.loads(w) for w in writes] == records and all(w.endswith(b"\n") for w in writes)


# -- checkpoints --------------------------------------------------------------------------------


def fake_checkpoint(path: Path, iteration: int, *, sealed: bool = True) -> Path:
    """A folder laid out as GRPO's checkpoints are (RLlib's files, the adapter)."""
    (path / "learner_group" / "learner").mkdir(parents=True)
    (path / "adapter").mkdir()
    (path / "metadata.json").write_text("{}")
    (path / "class_and_ctor_args.pkl").write_bytes(b"\x80ctor")
    (path / "state.pkl").write_bytes(os.urandom(4096))
    (path / "learner_group" / "learner" / "module_state.pkl").write_bytes(os.urandom(10_000))
    for component in (path / "learner_group", path / "learner_group" / "learner"):  # as RLlib lays them out
        (component / "metadata.json").write_text("{}")
        (component / "class_and_ctor_args.pkl").write_bytes(b"\x80ctor")
    (path / "adapter" / "adapter_model.safetensors").write_bytes(os.urandom(2048))
    if sealed:
        seal(path, iteration)
    return path


def test_a_checkpoint_is_complete_only_with_every_file_it_lists(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "checkpoint_000001", 2)
    assert problems(ckpt) == [] and require_complete(ckpt).iteration == 2
    listed = json.loads((ckpt / MARKER).read_text())["files"]
    assert listed["learner_group/learner/module_state.pkl"] == 10_000 and MARKER not in listed

    module = ckpt / "learner_group" / "learner" / "module_state.pkl"
    module.write_bytes(module.read_bytes()[:300])  # a copy cut short
    (ckpt / "adapter" / "adapter_model.safetensors").unlink()  # a delete interrupted
    with pytest.raises(CheckpointError) as err:
        require_complete(ckpt)
    assert "learner_group/learner/module_state.pkl has 300 of its 10000 bytes" in str(err.value)
    assert "adapter/adapter_model.safetensors is missing" in str(err.value)

    unsealed = fake_checkpoint(tmp_path / "checkpoint_000002", 3, sealed=False)
    with pytest.raises(CheckpointError, match=f"no {MARKER} .*the save did not finish.*holds class_and_ctor_args"):
        require_complete(unsealed)


def test_resume_takes_the_newest_complete_checkpoint_and_says_which(tmp_path):
    run = tmp_path / "run"
    old = fake_checkpoint(run / "tune" / "GRPO_a" / "checkpoint_000000", 1)
    newer = fake_checkpoint(run / "tune" / "GRPO_b" / "checkpoint_000000", 3)
    cut_short = fake_checkpoint(run / "tune" / "GRPO_b" / "checkpoint_000001", 4)
    (cut_short / "state.pkl").unlink()
    fake_checkpoint(run / "tune" / "GRPO_b" / ".checkpoint_000002.partial-0123abcd", 5, sealed=False)
    choice = resume_point(run)
    assert choice.checkpoint.path == newer and choice.checkpoint.iteration == 3
    text = choice.describe()
    assert str(newer) in text and "iteration 3" in text and "state.pkl is missing" in text
    assert newest_complete(run / "tune" / "GRPO_a").checkpoint.path == old  # a trial folder
    # Named, a checkpoint must be complete itself: no silent fallback to another.
    with pytest.raises(CheckpointError, match=r"checkpoint_000001 is incomplete: state.pkl is missing"):
        resume_point(cut_short)
    with pytest.raises(CheckpointError, match="no complete checkpoint under .*no draco_checkpoint.json"):
        resume_point(_only_incomplete(tmp_path))


def _only_incomplete(tmp_path: Path) -> Path:
    root = tmp_path / "only"
    fake_checkpoint(root / "checkpoint", 1, sealed=False)
    return root


def test_install_and_copy_replace_a_checkpoint_only_once_the_new_one_is_complete(tmp_path):
    final = tmp_path / "run" / "checkpoint"
    first = fake_checkpoint(tmp_path / "a", 1)
    copy_checkpoint(first, final)
    assert require_complete(final).iteration == 1
    second = fake_checkpoint(tmp_path / "b", 2)
    copy_checkpoint(second, final)
    assert require_complete(final).iteration == 2
    assert sorted(p.name for p in final.parent.iterdir()) == ["checkpoint"]  # no staging or old copy left

    broken = fake_checkpoint(tmp_path / "c", 3)
    (broken / "state.pkl").unlink()
    with pytest.raises(CheckpointError):
        copy_checkpoint(broken, final)
    assert require_complete(final).iteration == 2  # the complete one stays
    # Tune's empty temporary folder is replaced in the same rename.
    empty = tmp_path / "tune_tmp"
    empty.mkdir()
    staged = staging_dir(empty)
    fake_checkpoint(staged, 4)
    install(staged, empty)
    assert require_complete(empty).iteration == 4 and not staged.exists()


# -- continuing the logs ------------------------------------------------------------------------


def events_file(trial: Path, iterations: range) -> Path:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(trial))
    for it in iterations:  # as Tune's TBX logger does: step = training_iteration, not itself logged
        writer.add_scalar("ray/tune/timers/training_iteration", 5.2, global_step=it)  # RLlib's seconds
        writer.add_scalar("ray/tune/env_runners/episode_return_mean", it / 10, global_step=it)
    writer.close()
    (path,) = trial.glob("events.out.tfevents.*")
    return path


def event_steps(path: Path) -> list[int]:
    from draco_gym.algos.run_folder import _event_records

    from tensorboardX.proto import event_pb2

    records, _ = _event_records(path)
    data = path.read_bytes()
    steps = set()
    for pos, step, _ in records:  # the records that log scalars (not the file's version record)
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        if event_pb2.Event.FromString(data[pos + 12:pos + 12 + length]).summary.value:
            steps.add(step)
    return sorted(steps)


def test_resume_cuts_every_log_at_the_checkpoint_and_keeps_the_rest_aside(tmp_path):
    run = tmp_path / "run"
    append_records(run / "metrics.jsonl", [{"training_iteration": i, "x": i} for i in (1, 2, 3, 4)])
    append_records(run / "rollouts.jsonl", [{"iteration": i, "task_id": "t", "index": j}
                                            for i in (0, 1, 2, 3) for j in (0, 1)])
    with open(run / "rollouts.jsonl", "ab") as fh:
        fh.write(b'{"iteration": 4, "task_id"')  # torn: killed mid-iteration
    trial = run / "tune" / "GRPO_PythonTools_00000"
    trial.mkdir(parents=True)
    append_records(trial / "result.json", [{"training_iteration": i} for i in (1, 2, 3, 4)])
    (trial / "progress.csv").write_text("x,training_iteration\n" + "".join(f"{i / 10},{i}\n" for i in (1, 2, 3, 4)))
    events = events_file(trial, range(1, 5))
    kept = fake_checkpoint(trial / "checkpoint_000001", 2)
    later = fake_checkpoint(trial / "checkpoint_000002", 4)
    partial = fake_checkpoint(trial / ".checkpoint_000003.partial-00aa", 5, sealed=False)

    done = continue_logs(run, 2)
    assert [r["training_iteration"] for r in read_records(run / "metrics.jsonl")[0]] == [1, 2]
    assert [r["iteration"] for r in read_records(run / "rollouts.jsonl")[0]] == [0, 0, 1, 1]
    assert [r["training_iteration"] for r in read_records(trial / "result.json")[0]] == [1, 2]
    assert (trial / "progress.csv").read_text() == "x,training_iteration\n0.1,1\n0.2,2\n"
    assert event_steps(events) == [1, 2]
    assert require_complete(kept).iteration == 2 and not later.exists() and not partial.exists()

    aside = done.aside
    assert aside.parent == run / "set-aside" and aside.name.endswith("-after-iteration-2")
    assert [r["training_iteration"] for r in read_records(aside / "metrics.jsonl")[0]] == [3, 4]
    moved, torn = read_records(aside / "rollouts.jsonl")
    assert [r["iteration"] for r in moved] == [2, 2, 3, 3] and torn == 1  # the torn line kept too
    rel = trial.relative_to(run)
    assert [r["training_iteration"] for r in read_records(aside / rel / "result.json")[0]] == [3, 4]
    assert (aside / rel / "progress.csv").read_text() == "0.3,3\n0.4,4\n"
    assert event_steps(aside / rel / events.name) == [3, 4]
    assert require_complete(aside / rel / "checkpoint_000002").iteration == 4
    assert (aside / rel / partial.name).is_dir()
    assert "metrics.jsonl 2" in done.describe() and "rollouts.jsonl 5" in done.describe()

    # A second resume at the same point moves nothing more.
    again = continue_logs(run, 2)
    assert all(n == 0 for _, _, n in again.logs) and not again.folders

    # A damaged line before the cut stops the resume and moves nothing.
    (run / "metrics.jsonl").write_bytes(b'{"training_iteration": 1}\n\xff\xfe\n{"training_iteration": 2}\n')
    before = (run / "rollouts.jsonl").read_bytes()
    with pytest.raises(RecordError, match="metrics.jsonl line 2 is damaged"):
        continue_logs(run, 1)
    assert (run / "rollouts.jsonl").read_bytes() == before


# -- the command: nothing touched before the run is known to start -------------------------------


def tree_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def earlier_run(out: Path) -> None:
    append_records(out / "metrics.jsonl", [{"training_iteration": 1}])
    append_records(out / "rollouts.jsonl", [{"iteration": 0, "task_id": "t", "index": 0, "trajectory": {}}])
    fake_checkpoint(out / "checkpoint", 1)
    fake_checkpoint(out / "tune" / "GRPO_x" / "checkpoint_000000", 1)


def write_config(tmp_path: Path, model: Path, out: Path, **extra) -> Path:
    config = {
        "name": "lose-nothing", "output_dir": str(out), "iterations": 2,
        "env": {"id": "draco_gym/PythonTools-v0", "config": {"max_turns": 2}},
        "policy": {"model": str(model), "lora": {"r": 4, "alpha": 8}},
        "rollout": {"group_size": 2, "tasks_per_iteration": 1, "max_new_tokens": 8, "max_response_tokens": 64},
        "optim": {"minibatch_size": None},
        "resources": {"ray_num_cpus": 2, "object_store_memory_mb": 80},
        **extra,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_an_earlier_run_is_left_alone_by_a_bad_override_and_without_resume_or_overwrite(tiny_model, tmp_path,
                                                                                         capsys):
    out = tmp_path / "run"
    earlier_run(out)
    before = tree_digest(out)
    config = write_config(tmp_path, tiny_model, out)

    assert main(["train", str(config), "--set", "rollout.group_sise=4"]) == 2
    assert "rollout.group_sise" in capsys.readouterr().err
    assert main(["train", str(config), "--overwrite", "--set", "env.config.max_turns=-3"]) == 2
    assert "env.config" in capsys.readouterr().err
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "holds an earlier run" in err and "--resume" in err and "--overwrite" in err
    assert tree_digest(out) == before


def test_resume_refuses_an_incomplete_checkpoint_naming_what_is_missing(tiny_model, tmp_path, capsys):
    out = tmp_path / "run"
    earlier_run(out)
    (out / "checkpoint" / "state.pkl").unlink()
    before = tree_digest(out)
    config = write_config(tmp_path, tiny_model, out)
    assert main(["train", str(config), "--resume", str(out / "checkpoint")]) == 2
    assert "checkpoint is incomplete: state.pkl is missing" in capsys.readouterr().err
    assert main(["eval", str(config), "--checkpoint", str(out / "checkpoint")]) == 2
    assert "state.pkl is missing" in capsys.readouterr().err
    assert tree_digest(out) == before


def test_check_builds_the_env_and_resolves_model_and_tokenizer(tiny_model, tmp_path, capsys):
    out = tmp_path / "run"
    config = write_config(tmp_path, tiny_model, out)
    assert main(["train", str(config), "--check"]) == 0
    assert "ok" in capsys.readouterr().out

    assert main(["train", str(config), "--check", "--set", f"policy.model={tmp_path / 'no-such-model'}"]) == 2
    assert "policy.model:" in capsys.readouterr().err
    no_tokenizer = tmp_path / "weights-only"
    no_tokenizer.mkdir()
    (no_tokenizer / "config.json").write_text((Path(tiny_model) / "config.json").read_text())
    assert main(["train", str(config), "--check", "--set", f"policy.model={no_tokenizer}"]) == 2
    assert "policy.model:" in capsys.readouterr().err
    assert main(["train", str(config), "--check", "--set", "env.config.no_such_option=1"]) == 2
    err = capsys.readouterr().err
    assert "env.config:" in err and "no_such_option" in err
    assert not out.exists()


def test_check_probes_a_configured_judge_server(tiny_model, tmp_path, capsys):
    """A judge server nobody listens at fails ``--check``, naming the key and the port
    (``reward.judge_health.probe_judge``)."""
    import socket

    with socket.socket() as sock:  # a port with nothing behind it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = write_config(tmp_path, tiny_model, tmp_path / "run", reward={
        "name": "dynamic", "options": {"judge": {"name": "openai", "model": "m", "base_url": f"http://127.0.0.1:{port}/v1"}}})
    code = main(["train", str(config), "--check"])
    printed = capsys.readouterr()
    assert code == 2 and "reward.options.judge:" in printed.err and str(port) in printed.err


# -- damaged input to report --------------------------------------------------------------------


def test_check_probes_every_judge_a_config_names_weighted_parts_and_credit_included(tiny_model, tmp_path, capsys):
    """A judge inside a weighted reward's parts (a part of a part too) and a credit rule's
    judge are probed like reward.options.judge: each named by its key."""
    import socket

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from judge_server import JudgeServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    def judged(url):
        return {"name": "dynamic", "options": {"judge": {"name": "openai", "model": "m", "base_url": url,
                                                         "api_key_env": "NO_SUCH_KEY_VARIABLE"}}}

    with JudgeServer(lambda request: {"ok": True}) as up, JudgeServer(lambda request: {"ok": True}) as deep:
        nested = {"name": "weighted", "options": {"parts": [
            {"name": "outcome", "weight": 1.0},
            {"name": "weighted", "weight": 0.5, "options": {"parts": [{**judged(deep.base_url), "weight": 1.0}]}},
            {**judged(up.base_url), "weight": 0.25}]}}
        config = write_config(tmp_path, tiny_model, tmp_path / "run", reward=nested)
        assert main(["train", str(config), "--check"]) == 0
        out = capsys.readouterr().out
        assert f"reward.options.parts[1].options.parts[0].options.judge: judge at {deep.base_url} answered a probe" in out
        assert f"reward.options.parts[2].options.judge: judge at {up.base_url} answered a probe" in out
        assert len(up.requests) == len(deep.requests) == 1
        nested["options"]["parts"][2] = {**judged(f"http://127.0.0.1:{port}/v1"), "weight": 0.25}
        config = write_config(tmp_path, tiny_model, tmp_path / "run", reward=nested)
        assert main(["train", str(config), "--check"]) == 2
        err = capsys.readouterr().err
        assert "error: reward.options.parts[2].options.judge: " in err and str(port) in err


def test_report_names_damage_skips_a_torn_line_and_warns_of_a_repeated_iteration(tmp_path, capsys):
    from report_fixtures import write_hand_made_run

    run = tmp_path / "run"
    write_hand_made_run(run)
    rollouts = run / "rollouts.jsonl"
    whole = rollouts.read_bytes()
    rollouts.write_bytes(whole + b'{"iteration": 9, "task_id": "t", "traj')
    assert main(["report", str(run)]) == 0
    assert "rollouts.jsonl: its last line is torn" in capsys.readouterr().err

    rollouts.write_bytes(whole + b"\x00\x89\xfe binary tail \xff\n")
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert "rollouts.jsonl line" in err and "is not UTF-8 text" in err and "Traceback" not in err

    rollouts.write_bytes(whole)
    rows = read_records(run / "metrics.jsonl")[0]
    append_records(run / "metrics.jsonl", [rows[0]])  # iteration 1 again, as an uncut resume wrote it
    assert main(["report", str(run)]) == 0
    assert f"metrics.jsonl repeats iteration(s) {rows[0]['training_iteration']}" in capsys.readouterr().err
    html = (run / "report.html").read_text()
    assert "repeats iteration" in html

    (run / "summary.json").write_bytes(b"\xff\xfe{")
    assert main(["report", str(run)]) == 2
    assert "summary.json is not UTF-8 text" in capsys.readouterr().err


# -- SIGKILL and resume, through the real command -----------------------------------------------


class Train:
    """``draco-gym train`` in a process group of its own, with the test hooks on its path."""

    def __init__(self, config: Path, args: list[str], log: Path, ray_tmp: Path, **hooks: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
               "RAY_TMPDIR": str(ray_tmp), "OMP_WAIT_POLICY": "PASSIVE", "RAY_AUTH_MODE": "disabled",
               **{f"DRACO_TEST_{k.upper()}": v for k, v in hooks.items()}}
        self.log = log
        self.fh = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "draco_gym.cli", "train", str(config), *args], env=env,
                                     stdout=self.fh, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for(self, flag: Path, also=lambda: True, timeout: float = 900) -> None:
        deadline = time.time() + timeout
        while not (flag.exists() and also()):
            if self.proc.poll() is not None:
                raise AssertionError(f"train exited with {self.proc.returncode} before {flag.name}:\n"
                                     + self.log.read_text()[-4000:])
            if time.time() > deadline:
                self.kill()
                raise AssertionError(f"{flag.name} not reached in {timeout} s:\n" + self.log.read_text()[-4000:])
            time.sleep(0.5)

    def kill(self) -> None:
        """SIGKILL to the command and every process under it (Ray's included), by pid."""
        import psutil

        try:
            procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        self.proc.wait(timeout=60)
        psutil.wait_procs(procs, timeout=60)
        self.fh.close()

    def finish(self, timeout: float = 900) -> str:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.kill()
            self.fh.close()
        text = self.log.read_text()
        assert self.proc.returncode == 0, text[-4000:]
        return text


def checkpoint_digest(path: Path) -> str:
    import pickle

    from draco_gym.algos.rllib.env_runner import weights_digest

    (module,) = [p for p in path.rglob("module_state.pkl") if "default_policy" in str(p)]
    with open(module, "rb") as fh:
        return weights_digest(pickle.load(fh))


def records_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
@pytest.mark.timeout(2400)  # three runs of the command, each starting Ray: minutes apiece on a loaded CPU
def test_sigkill_mid_checkpoint_and_between_iterations_then_resume(tiny_model, tmp_path):
    out = tmp_path / "run"
    # Weight decay moves the adapter every iteration even when the tiny policy's rewards tie,
    # so every checkpoint holds other weights than the next.
    config = write_config(tmp_path, tiny_model, out, iterations=4, checkpoint={"every": 1, "keep": 1},
                          optim={"minibatch_size": None, "lr": 0.01, "weight_decay": 0.5},
                          env={"id": "draco_gym/PythonTools-v0", "config": {"max_turns": 2},
                               "modules": ["run_hooks"]})
    ray_tmp = Path(tempfile.mkdtemp(prefix="rk", dir="/tmp"))
    record = tmp_path / "record.jsonl"

    # 1. Killed while iteration 2's checkpoint is half written (iteration 1's is complete and,
    #    with keep: 1, the only one Tune keeps once 2's is complete).
    flag = tmp_path / "held-1"
    first = Train(config, [], tmp_path / "first.log", ray_tmp, hold="checkpoint:2", hold_flag=str(flag),
                  record=str(record))
    first.wait_for(flag)
    first.kill()
    trusted = [p for p in (out / "tune").glob("*/checkpoint_*")]
    assert len(trusted) == 1 and problems(trusted[0]) == [], f"a checkpoint folder nothing should trust: {trusted}"
    assert require_complete(trusted[0]).iteration == 1
    (partial,) = (out / "tune").glob("*/.checkpoint_*.partial-*")
    assert not (partial / MARKER).exists()
    assert [r["training_iteration"] for r in read_records(out / "metrics.jsonl")[0]] == [1, 2]
    assert main(["train", str(config), "--resume", str(partial)]) == 2  # refused by name
    assert main(["train", str(config)]) == 2  # the killed run's folder is not overwritten silently
    from draco_gym.algos.rllib.grpo import GRPO

    assert not getattr(GRPO, "_run_hooks", False), "the hooks patched this process's GRPO for later tests too"

    # 2. Resumed (the newest complete checkpoint: iteration 1), every 2 iterations a checkpoint,
    #    killed before its iteration 4, after iteration 3's row (no checkpoint since 2).
    flag = tmp_path / "held-2"
    second = Train(config, ["--resume", "--set", "checkpoint.every=2"], tmp_path / "second.log", ray_tmp,
                   hold="iteration:3", hold_flag=str(flag), record=str(record))
    second.wait_for(flag, also=lambda: len(read_records(out / "metrics.jsonl")[0]) == 3)
    second.kill()
    text = (tmp_path / "second.log").read_text()
    assert f"resuming from {trusted[0]} (iteration 1)" in text
    restored = [r for r in records_of(record) if r["event"] == "restored"]
    assert restored[-1]["digest"] == checkpoint_digest(trusted[0]), "the resumed weights are not the checkpoint's"
    sampled = [r for r in records_of(record) if r["event"] == "sampled"]
    assert sampled[-2]["iteration"] == 1 and sampled[-2]["digests"] == [restored[-1]["digest"]], \
        "the first resumed iteration sampled with other weights than the checkpoint's"
    assert [r["training_iteration"] for r in read_records(out / "metrics.jsonl")[0]] == [1, 2, 3]
    aside_1 = next((out / "set-aside").glob("resume-*-after-iteration-1"))
    assert [r["training_iteration"] for r in read_records(aside_1 / "metrics.jsonl")[0]] == [2]
    assert list(aside_1.rglob(".checkpoint_*.partial-*"))  # the half-written one, kept aside

    # 3. Resumed again: from iteration 2's checkpoint, iteration 3's logs set aside, to the end.
    newest = newest_complete(out).checkpoint
    assert newest.iteration == 2 and checkpoint_digest(newest.path) != checkpoint_digest(trusted[0])
    third = Train(config, ["--resume"], tmp_path / "third.log", ray_tmp, record=str(record))
    text = third.finish()
    assert f"resuming from {newest.path} (iteration 2)" in text
    restored = [r for r in records_of(record) if r["event"] == "restored"]
    assert restored[-1]["digest"] == checkpoint_digest(newest.path)

    # Every iteration once in each log.
    assert [r["training_iteration"] for r in read_records(out / "metrics.jsonl")[0]] == [1, 2, 3, 4]
    rollouts = [r["iteration"] for r in read_records(out / "rollouts.jsonl")[0]]
    assert rollouts == [0, 0, 1, 1, 2, 2, 3, 3]
    aside_2 = next((out / "set-aside").glob("resume-*-after-iteration-2"))
    assert [r["training_iteration"] for r in read_records(aside_2 / "metrics.jsonl")[0]] == [3]
    assert {r["iteration"] for r in read_records(aside_2 / "rollouts.jsonl")[0]} == {2}
    # Tune's own files in the trial folders (TensorBoard's events, result.json) reach storage
    # when Tune syncs them: a kill can cost the rows since its last sync, but no step is there
    # twice, and the last attempt holds its own iterations.
    # The last attempt's trial: the one whose result.json reached iteration 4.
    (finished,) = [t for t in (out / "tune").glob("GRPO_*")
                   if 4 in {r["training_iteration"] for r in read_records(t / "result.json")[0]}]
    steps: list[int] = []
    for events in (out / "tune").glob("*/events.out.tfevents.*"):
        steps += event_steps(events)
    assert len(steps) == len(set(steps)) and set(steps) <= {1, 2, 3, 4}, f"TensorBoard steps {sorted(steps)}"
    for aside, k in ((aside_1, 1), (aside_2, 2)):  # only what came after the checkpoint was set aside
        for events in aside.rglob("events.out.tfevents.*"):
            assert min(event_steps(events), default=k + 1) > k, (events, event_steps(events))
        for result in aside.rglob("result.json"):
            assert min(r["training_iteration"] for r in read_records(result)[0]) > k
    assert [event_steps(e) for e in finished.glob("events.out.tfevents.*")] == [[3, 4]], \
        {str(e.relative_to(out)): event_steps(e) for e in out.rglob("events.out.tfevents.*")}
    tune_rows = [r["training_iteration"] for path in (out / "tune").glob("*/result.json")
                 for r in read_records(path)[0]]
    assert len(tune_rows) == len(set(tune_rows)) and {3, 4} <= set(tune_rows) <= {1, 2, 3, 4}, tune_rows
    print(f"TensorBoard steps {sorted(steps)}, Tune result.json rows {sorted(tune_rows)}")
    assert require_complete(out / "checkpoint").iteration == 4


def test_a_json_file_is_replaced_whole_or_not_at_all(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, {"eval": {"after": 0.5}})
    with pytest.raises(TypeError):
        write_json(path, {"eval": {"after": 0.75}, "model": object()})  # fails halfway through the dump
    assert json.loads(path.read_text()) == {"eval": {"after": 0.5}}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
