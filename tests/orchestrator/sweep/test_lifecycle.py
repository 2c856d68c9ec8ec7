"""A sweep's lifecycle under the faults a lab meets, each in a real process against a real Ray and MLflow store:
two starts in the same second, SIGINT and SIGTERM mid-sweep followed by ``--resume``, a second resume of a
running sweep (docs/reliability.md)."""

from __future__ import annotations

import json
import signal
import time

import pytest
import yaml

from results import store
from tests.conftest import ROOT, needs_root, run_main, snapshot
from tests.orchestrator.procs import SLOW, Pace, histories, kill_session, start_cli, wait_for

GRID = [{"kind": "fp32"}, {"kind": "static", "fw": 8, "bw": 8}, {"kind": "static", "fw": 4, "bw": 8}]


def _spec(tmp_path, name: str, epochs: int, grid: list[dict], pace: Pace | None = None):
    spec = tmp_path / f"{name}.yaml"
    debug = pace.debug if pace else SLOW["debug"]
    spec.write_text(yaml.safe_dump({"name": name, "base": {**SLOW, "optim": {"epochs": epochs}, "debug": debug},
                                    "parameters": {"schedule": {"grid": grid}},
                                    "budget": {"max_concurrent_trials": 1}, "resources": {"cpu": 1}}))
    return spec


def _args(spec, tmp_path, uri, ray_local):
    return ("sweep", str(spec), "--storage", str(tmp_path / "runs"), "--tracking-uri", uri, "--quiet",
            "--no-report", "--address", ray_local.get_runtime_context().gcs_address)


def _all_runs(uri: str, name: str) -> list:
    c = store.client(uri)
    exp = c.get_experiment_by_name(name)
    return c.search_runs([exp.experiment_id], max_results=1000)


@pytest.mark.slow
def test_two_sweeps_started_in_the_same_second_keep_apart(ray_local, tmp_path, sqlite_uri):
    """Each start gets its own id, parent run, storage state and summary, and its point runs once per sweep."""
    spec = _spec(tmp_path, "twins", 1, GRID[:1])
    procs = []
    for i in range(2):
        folder = tmp_path / f"p{i}"
        folder.mkdir()
        procs.append(start_cli(*_args(spec, tmp_path, sqlite_uri, ray_local), "--json", cwd=folder,
                               env={"RAY_ADDRESS": ""}))
    try:
        assert [p.wait(timeout=300) for p in procs] == [0, 0], (tmp_path / "p0" / "stderr.log").read_text()[-2000:]
    finally:
        for p in procs:
            kill_session(p.pid)
    outs = [json.loads((tmp_path / f"p{i}" / "stdout.log").read_text().splitlines()[-1]) for i in range(2)]
    assert outs[0]["sweep_id"] != outs[1]["sweep_id"] and outs[0]["parent_run_id"] != outs[1]["parent_run_id"]
    assert outs[0]["storage"] != outs[1]["storage"]
    runs = _all_runs(sqlite_uri, "twins")
    parents = [r for r in runs if r.data.tags.get("fractune.kind") == "sweep"]
    assert sorted(r.data.tags[store.SWEEP_TAG] for r in parents) == sorted(o["sweep_id"] for o in outs)
    for out in outs:  # each sweep's own two trials, once each, all finished; its front only its own runs
        children = [r for r in runs if r.data.tags.get(store.PARENT_TAG) == out["parent_run_id"]]
        assert len(children) == 1 and all(r.info.status == "FINISHED" for r in children)
        assert {e["run_id"] for e in out["pareto"]} <= {r.info.run_id for r in children}


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_sweep_says_so_and_resumes_every_trial_once(ray_local, tmp_path, sqlite_uri, signum, code):
    """SIGINT / SIGTERM: the trials stop, every run left open is KILLED (none RUNNING), one line names the
    signal and the exact resume command, the exit code is 130 / 143; that command then finishes the sweep with
    every trial once and every epoch once, and a trial finished before the signal is not run again (resumed after
    SIGINT only: the state either signal leaves is the same)."""
    name = f"stop_{signum.name.lower()}"
    pace = Pace(tmp_path)
    spec = _spec(tmp_path, name, 5, GRID, pace)
    args = _args(spec, tmp_path, sqlite_uri, ray_local)
    proc = start_cli(*args, cwd=tmp_path, env={"RAY_ADDRESS": ""})
    try:
        def one_finished_one_running():
            try:
                h = histories(sqlite_uri, name)
            except Exception:  # nothing logged yet
                return None
            done = [k for k, v in h.items() if v["status"] == "FINISHED"]
            running = [k for k, v in h.items() if v["status"] == "RUNNING" and v["steps"]]
            return (done, h) if done and running else None

        done, before = wait_for(one_finished_one_running, timeout=240, what="a finished and a running trial")
        # read while it runs: the front of what is done, and a line saying so
        read, _, running = run_main("pareto", name, "--tracking-uri", sqlite_uri, "--json")
        assert read == 0 and running["status"] == "RUNNING" and running["partial"] is True
        assert running["planned"] == 3 and running["finished"] >= 1
        signalled_at = time.time() * 1000
        proc.send_signal(signum)
        assert proc.wait(timeout=120) == code
    finally:
        kill_session(proc.pid)
        pace.release()  # the resume below runs at full speed
    err = (tmp_path / "stderr.log").read_text()
    line = next(x for x in err.splitlines() if f"interrupted by {signum.name}" in x)
    assert "Traceback" not in err
    command = line.split("resume with: ", 1)[1]
    assert command.split()[:4] == ["fractune", "sweep", str(spec), "--resume"]
    stopped = histories(sqlite_uri, name)
    assert {v["status"] for v in stopped.values()} <= {"FINISHED", "KILLED"} and "KILLED" in {
        v["status"] for v in stopped.values()}
    assert all(v["end"] and v["end"] >= v["start"] for v in stopped.values())  # interrupted runs ended, timed
    assert store.sweep_parent(store.client(sqlite_uri), name).info.status == "KILLED"
    _, _, stopped_front = run_main("pareto", name, "--tracking-uri", sqlite_uri, "--json")
    assert stopped_front["status"] == "KILLED" and stopped_front["partial"] is True
    if signum == signal.SIGTERM:  # the resume is the same after either signal: run once, after SIGINT
        return

    # the printed command, run in this process on the session's Ray
    resumed, text, out = run_main(*command.split()[1:], "--quiet", "--no-report", "--json")
    assert resumed == 0, text[-3000:]
    after = histories(sqlite_uri, name)
    assert len(after) == 3 and all(r["status"] == "FINISHED" and r["steps"] == [1, 2, 3, 4, 5]
                                   for r in after.values())
    for trial in done:  # finished before the signal: not run again
        assert after[trial]["last_ts"] == before[trial]["last_ts"] < signalled_at
    for trial, run in after.items():  # every run's end time is when it finished: after the resume for the resumed
        assert run["end"] >= run["last_ts"] and (trial in done or run["end"] > signalled_at)
    assert store.sweep_parent(store.client(sqlite_uri), name).info.status == "FINISHED"
    assert out["trials"] == 3 and out["errored"] == 0


def test_a_second_resume_of_a_running_sweep_is_refused(tmp_path):
    """The lock on the sweep's folder: while one process holds it, another resume exits 2 naming the pid."""
    import subprocess
    import sys

    from orchestrator.sweep.lifecycle import LOCK_FILE, hold_sweep

    exp = tmp_path / "runs" / "held-20260101-000000"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]);"
                               "from orchestrator.sweep.lifecycle import hold_sweep; from pathlib import Path;"
                               "hold_sweep(Path(sys.argv[2]), 'held'); print('held', flush=True); time.sleep(60)",
                               str(ROOT), str(exp)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Exception, match=f"running in another process \\(pid {holder.pid}\\)"):
            hold_sweep(exp, "held")
    finally:
        holder.kill()
        holder.wait()
    hold_sweep(exp, "held")  # free again once the holder is gone
    assert (exp / LOCK_FILE).read_text().strip().isdigit()


@pytest.mark.parametrize("staged", [False, True])
def test_a_resume_into_a_store_that_never_tracked_the_sweep_is_refused(tmp_path, store_template, capsys, staged):
    """The sweep's folder records its parent run; a --tracking-uri whose store lacks it (another store, or one that
    does not exist) is refused in one line naming the field, before anything is created or written; the store
    that holds the parent run passes the check."""
    import json as json_

    from tests.conftest import copy_store, hand_logged_sweep

    spec = _spec(tmp_path, "moved", 1, GRID[:1])
    exp = tmp_path / "runs" / "moved-20260101-000000"
    home = copy_store(store_template, tmp_path / "home.db")
    _, parent, _ = hand_logged_sweep(store.client(home), "moved", exp.name, {"accuracy": 0.5})
    tracked = exp / "pre" if staged else exp
    tracked.mkdir(parents=True)
    (exp / ("stages.json" if staged else "tuner.pkl")).write_bytes(b"{}")
    (tracked / "fractune_tracking.json").write_text(json_.dumps({"parent_run_id": parent.info.run_id}))
    other = copy_store(store_template, tmp_path / "other.db")
    before = snapshot(tmp_path)
    for uri, cause in ((other, f"sweep {exp.name} was not tracked here (its parent run {parent.info.run_id} is not "
                               "in this store)"), (f"sqlite:///{tmp_path / 'none.db'}", "no tracking store at")):
        code, _, _ = run_main("sweep", str(spec), "--resume", "--storage", str(tmp_path / "runs"), "--tracking-uri",
                              uri, "--no-report")
        err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert code == 2 and len(err) == 1 and err[0].startswith(f"fractune sweep: error: --tracking-uri: got {uri!r}")
        assert cause in err[0], err
        assert snapshot(tmp_path) == before  # nothing created, nothing written
    from orchestrator.sweep.lifecycle import check_resume_store

    check_resume_store(home, exp, exp.name)  # the store it started in


@pytest.mark.slow
def test_a_trial_whose_loss_explodes_is_flagged_diverged(ray_local, tmp_path, sqlite_uri, capsys):
    """A loss far past chance's that never turns NaN: the run finishes, tagged diverged, and `pareto` names it."""
    spec = tmp_path / "boom.yaml"
    spec.write_text(yaml.safe_dump({"name": "boom", "base": {**SLOW, "optim": {"epochs": 1}, "debug": {}},
                                    "parameters": {"optim.lr": {"grid": [0.1, 30.0]}},
                                    "budget": {"max_concurrent_trials": 1}, "resources": {"cpu": 1}}))
    code, _, out = run_main("sweep", str(spec), "--storage", str(tmp_path / "runs"), "--tracking-uri", sqlite_uri,
                            "--quiet", "--no-report", "--json")
    assert code == 0 and out["errored"] == 0
    runs = histories(sqlite_uri, "boom")
    flagged = {k: v["tags"].get("fractune.diverged") for k, v in runs.items()}
    assert sorted(flagged.values(), key=str) == [None, "epoch 1"]
    capsys.readouterr()
    code, _, front = run_main("pareto", "boom", "--tracking-uri", sqlite_uri, "--json")
    assert len(front["diverged"]) == 1 and front["partial"] is False
    assert "diverged (its training loss passed the engine's bound at epoch 1)" in capsys.readouterr().err


@pytest.mark.slow
@needs_root
def test_storage_that_fills_or_turns_read_only_mid_sweep_leaves_a_resumable_sweep(ray_local, tmp_path, sqlite_uri,
                                                                                  ext4):
    """While trials run, the storage fills up (a filler file takes every free byte); once space is back and the
    sweep resumed, it turns read-only (an ext4 file system's error handling, ``errors=remount-ro``, triggered
    through sysfs: what a failing disk does). Each time the sweep ends with exit 1 and one line naming --storage,
    the folder and the cause, and no run stays RUNNING; once write access is back, `--resume` finishes every
    trial, each once, every epoch once."""
    import subprocess

    name = "storage_faults"
    pace = Pace(tmp_path)
    spec = _spec(tmp_path, name, 4, GRID[:1], pace)  # one trial: each phase starts a trial process of its own
    storage = ext4.mount()
    args = ("sweep", str(spec), "--storage", str(storage), "--tracking-uri", sqlite_uri, "--quiet", "--no-report",
            "--address", ray_local.get_runtime_context().gcs_address)
    filler = storage / "filler"

    def logged() -> int:
        return sum(len(v["steps"]) for v in _histories_or_empty(sqlite_uri, name).values())

    def fault_mid_sweep(phase: str, *extra: str, fault, cause: str) -> None:
        folder = tmp_path / phase
        folder.mkdir()
        before = logged()
        proc = start_cli(*args, *extra, cwd=folder, env={"RAY_ADDRESS": ""})
        try:
            wait_for(lambda: logged() > before, timeout=240, what=f"an epoch logged ({phase})")
            fault()
            code = proc.wait(timeout=300)
        finally:
            kill_session(proc.pid)
        err = (folder / "stderr.log").read_text()
        errors = [x for x in err.splitlines() if x.startswith("fractune sweep: error:")]
        assert code == 1 and len(errors) == 1, err[-3000:]
        assert "--storage" in errors[0] and str(storage) in errors[0] and cause in errors[0], errors
        assert "RUNNING" not in {v["status"] for v in histories(sqlite_uri, name).values()}

    fault_mid_sweep("full", fault=lambda: subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"],
                                                         capture_output=True), cause="No space left on device")
    filler.unlink()
    fault_mid_sweep("read-only", "--resume", fault=ext4.fail, cause="Read-only file system")
    ext4.repair()
    pace.release()
    code, text, _ = run_main(*args, "--resume", "--json")  # in this process, on the session's Ray
    assert code == 0, text[-3000:]
    after = histories(sqlite_uri, name)
    assert len(after) == 1 and all(r["status"] == "FINISHED" and r["steps"] == [1, 2, 3, 4] for r in after.values())


def _histories_or_empty(uri: str, name: str) -> dict:
    try:
        return histories(uri, name)
    except Exception:  # nothing logged yet
        return {}


class Ext4:
    """An ext4 file system in an image file, mounted with ``errors=remount-ro``: ``fail()`` makes the kernel turn it
    read-only at once (sysfs ``trigger_fs_error``), open files or not; ``repair()`` checks it and mounts it
    writable again at the same place."""

    def __init__(self, folder):
        self.image, self.path = folder / "disk.ext4", folder / "ext4"

    def mount(self):
        import subprocess

        subprocess.run(["truncate", "-s", "64M", str(self.image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(self.image)], check=True)
        self.path.mkdir(exist_ok=True)
        self._mount()
        return self.path

    def _mount(self):
        import subprocess

        r = subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.path)],
                           capture_output=True, text=True)
        if r.returncode and not self.path.is_mount():
            pytest.skip(f"no loop device to mount an ext4 image ({r.stderr.strip()[:200]})")

    def device(self) -> str:
        for line in open("/proc/mounts"):
            dev, where = line.split()[:2]
            if where == str(self.path):
                return dev.rsplit("/", 1)[-1]
        raise AssertionError(f"{self.path} is not mounted")

    def fail(self):
        with open(f"/sys/fs/ext4/{self.device()}/trigger_fs_error", "w") as f:
            f.write("1")

    def repair(self):
        import subprocess

        subprocess.run(["umount", "-l", str(self.path)], check=True)
        subprocess.run(["e2fsck", "-f", "-y", str(self.image)], capture_output=True)
        self._mount()

    def unmount(self):
        import subprocess

        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


@pytest.fixture
def ext4(tmp_path):
    disk = Ext4(tmp_path)
    yield disk
    disk.unmount()
