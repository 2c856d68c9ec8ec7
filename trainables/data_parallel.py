"""One experiment on N data-parallel workers, on Ray Train (docs/methods.md §12, docs/cluster.md).

Ray Train's ``TorchTrainer`` starts N worker processes in one torch.distributed group (gloo on CPU, NCCL on a
GPU) and runs ``worker_loop`` in each: ``engine.train_and_evaluate`` on its slice of every global batch, the
engine keeping the ranks identical (engine.distributed). Every rank reports each epoch's metrics, as Ray Train
requires of all of them; rank 0 alone writes the checkpoint. A worker lost mid-run restarts the group from the
last checkpoint (``max_failures``), so every epoch is trained and reported once. The one module of the product
that imports ``ray.train`` (tests/test_architecture.py): Tune trainables use ``ray.tune`` only.
"""

from __future__ import annotations

import gc
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

FINAL = "fractune_final"  # the last report of every rank
FINAL_FILE = "final.json"  # in the last checkpoint: the run's summary metrics and per-epoch history


def worker_loop(config: dict) -> None:
    import ray.train
    import torch

    from engine.config.experiment import ExperimentConfig
    from engine.train import train_and_evaluate
    from trainables import scratch

    if not gc.get_freeze_count():  # as a Tune trial does (trainables.tune_trainable.train_trial)
        gc.freeze()
    cfg = ExperimentConfig.model_validate(config["experiment"])
    scratch.remove_stale()  # the folders of workers killed while they held one (a lost worker restarts the group)
    torch.set_num_threads(int(config.get("threads", 1)))
    rank = ray.train.get_context().get_world_rank()

    last: list[str] = []  # rank 0: the folder of the last checkpoint, kept for the final report

    def report(metrics: dict, save) -> None:
        if rank == 0:
            folder = tempfile.mkdtemp(prefix=scratch.prefix())
            save(folder)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
            for old in last:
                shutil.rmtree(old, ignore_errors=True)
            last[:] = [folder]
        else:
            ray.train.report(metrics)

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:  # a fresh run, or one resumed from a checkpoint folder of an earlier run
        result = train_and_evaluate(cfg, report=report, resume_from=config.get("resume"))
    else:  # a restarted group: every rank continues from rank 0's last checkpoint
        with checkpoint.as_directory() as folder:
            result = train_and_evaluate(cfg, report=report, resume_from=folder)
    # the summary and history travel in the last checkpoint (Ray Train's result holds the metrics of the
    # latest checkpoint), beside the last epoch's state
    if rank == 0 and last:
        (Path(last[0]) / FINAL_FILE).write_text(json.dumps({"metrics": result.metrics, "history": result.history}))
        ray.train.report({FINAL: 1}, checkpoint=ray.train.Checkpoint.from_directory(last[0]))
        shutil.rmtree(last[0], ignore_errors=True)
    else:
        ray.train.report({FINAL: 1})


def train_data_parallel(cfg, storage: str, name: str, cpus_per_worker: float = 1, gpus_per_worker: float = 0,
                        max_failures: int = 0, resume: str | None = None, callbacks: list | None = None,
                        this_node: bool = False) -> tuple[dict, list[dict], Any]:
    """Run ``cfg`` on ``cfg.workers`` workers of the Ray this process is connected to (``this_node``: all on this
    process's node, for a ``storage`` on its disk alone; otherwise ``storage`` must be a folder every node
    sees); returns the summary metrics, the per-epoch history and Ray Train's result (its ``checkpoint``: the last
    one rank 0 wrote).
    When the run fails past ``max_failures`` restarts, raises the lowest failed rank's own error where it is a
    fractune error (a ``DataError`` or a ``TrainingDiverged`` the engine raised in that worker, with its exit
    code), else ``RuntimeError`` with its last line."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchTrainer

    per_worker = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
    here = {"ray.io/node-id": ray.get_runtime_context().get_node_id()} if this_node else None
    trainer = TorchTrainer(
        worker_loop,
        # the checkpoint to resume from as an absolute path: Ray Train runs each worker in a folder of its own
        train_loop_config={"experiment": cfg.to_dict(), "threads": max(1, int(cpus_per_worker)),
                           "resume": str(Path(resume).absolute()) if resume else None},
        scaling_config=ScalingConfig(num_workers=cfg.workers, use_gpu=bool(gpus_per_worker),
                                     resources_per_worker=per_worker, label_selector=here),
        # the two newest checkpoints: the one a restarted group resumes from, and the one before it, which the
        # caller may still be copying (each epoch's is handed over as it is reported); on a long run the others
        # would fill the storage
        run_config=RunConfig(name=name, storage_path=storage, failure_config=FailureConfig(max_failures=max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2), callbacks=callbacks or []),
    )
    try:
        result = trainer.fit()
    except TrainingFailedError as err:  # Ray Train raises what its workers or controller raised, wrapped
        raise _run_error(err) from None
    if result.error is not None:
        raise _run_error(result.error)
    final = Path(result.checkpoint.path) / FINAL_FILE if result.checkpoint is not None else None
    if final is None or not final.is_file():
        raise RuntimeError("the run ended without its final report")
    data = json.loads(final.read_text())
    return data["metrics"], data["history"], result


def _run_error(err: BaseException) -> BaseException:
    """What a failed run raises: the error of its lowest failed rank (``WorkerGroupError.worker_failures``) or of
    its controller (``ControllerError.controller_failure``), itself when fractune raised it, else a
    ``RuntimeError`` of its last line (never Ray Train's multi-line wrapper with the workers' tracebacks)."""
    from engine.errors import FractuneError

    failures = getattr(err, "worker_failures", None) or {}
    cause = (failures[min(failures)] if failures else getattr(err, "controller_failure", None)) or err
    if isinstance(cause, FractuneError):
        return cause
    lines = [x.strip() for x in str(cause).strip().splitlines() if x.strip()]
    where = f"rank {min(failures)}: " if failures else ""
    return RuntimeError(where + (lines[-1] if lines else repr(cause)))


def train_epoch_by_epoch(cfg, workers: dict, storage: str, report_epoch,
                         resume: str | None = None) -> tuple[dict, list[dict]]:
    """Run ``cfg`` on Ray Train, handing each epoch to ``report_epoch(metrics, checkpoint folder)`` in this
    thread as it ends (rank 0's report); returns the summary metrics and the per-epoch history. ``workers``: the
    ``cpu`` and ``gpu`` of each worker, the group's ``max_failures`` (a lost worker restarts the group from its
    last checkpoint) and ``this_node`` (every worker on this node, where ``storage`` is a folder of this node's
    disk; otherwise they may spread over the cluster, and ``storage`` must be a folder every node sees). Each call
    is a new Ray Train run under ``storage``; ``resume``: a checkpoint folder it continues from.

    A sweep's data-parallel trial (spec ``resources.workers``) reports each epoch to Tune with its checkpoint, so
    a restored trial continues from it like any other; ``fractune train --workers`` prints each epoch and copies
    its checkpoint to ``--checkpoint-dir`` as it ends.

    The run is driven from a Ray task of its own on this node (``_drive``), which owns Ray Train's controller.
    When this thread stops listening (Tune stopping the trial raises in ``report_epoch``; Ctrl-C is a
    ``KeyboardInterrupt`` here) the run is aborted (``_stop``), instead of training on beside the next trial. Ray
    Train's own SIGINT handler, which would abort the run and exit the process with code 1, is installed in that
    task's process, never in this one."""
    import ray
    from ray.exceptions import RayTaskError
    from ray.util.queue import Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    epochs: Queue = Queue(actor_options={"num_cpus": 0})
    # on this node: the run's storage is read here (the checkpoints handed over, the final report)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    # the task runs in a Ray worker's folder, not this process's: paths go as absolute ones
    run = ray.remote(_drive).options(num_cpus=0, max_retries=0, scheduling_strategy=here).remote(
        cfg, workers, str(Path(storage).absolute()), str(Path(resume).absolute()) if resume else None, epochs)
    try:
        while (item := epochs.get()) is not None:
            report_epoch(*item)
        return ray.get(run)
    except RayTaskError as err:  # the run's own error, as train_data_parallel raised it in the task
        raise err.cause from None
    except BaseException:
        _stop(run)
        raise


STOP_S = 30.0  # how long a stopped run's abort may take before its driving task's process is killed


def _stop(run) -> None:
    """End a run whose caller stopped listening. ``ray.cancel`` interrupts the driving task as Ctrl-C would, and
    Ray Train's SIGINT handler there aborts the run: the workers stop and their placement group is removed. (A
    killed controller would leave that group holding the workers' CPUs: Ray Train's cleaner of it needs Ray's
    state API, which a Ray without its dashboard does not serve.) The task's process is killed if the abort does
    not end it within ``STOP_S``."""
    import ray

    ray.cancel(run)
    ended, _ = ray.wait([run], timeout=STOP_S)
    if not ended:
        ray.cancel(run, force=True)


def _drive(cfg, workers: dict, storage: str, resume: str | None, epochs) -> tuple[dict, list[dict]]:
    """``train_epoch_by_epoch``'s task: the Ray Train run, each epoch put on ``epochs`` by its controller, then
    the end (None) whatever happened."""
    import time

    try:
        metrics, history, _ = train_data_parallel(cfg, storage, f"run-{time.time_ns()}", workers["cpu"],
                                                  workers["gpu"], workers.get("max_failures", 0), resume,
                                                  callbacks=[_epoch_forwarder(epochs)],
                                                  this_node=workers.get("this_node", False))
        return metrics, history
    finally:
        epochs.put(None)


def _epoch_forwarder(queue):
    """A Ray Train callback, run in its controller, that puts rank 0's metrics of each epoch and the checkpoint
    reported with them on ``queue`` (the class is built here, as a run starts: ray.train is imported only then)."""
    from ray.train.v2.api.callback import UserCallback

    class ForwardEpochs(UserCallback):
        def __init__(self, queue):
            self.queue = queue

        def after_report(self, run_context, metrics, checkpoint):
            if metrics and FINAL not in metrics[0]:
                self.queue.put((dict(metrics[0]), checkpoint.path if checkpoint is not None else None))

    return ForwardEpochs(queue)
