"""The one training loop: ``train_and_evaluate(cfg, report) -> RunResult`` (architecture rule 6; docs/methods.md §8).

SGD (momentum 0.9, weight decay 1e-4 on all parameters), a piecewise (/10 at 50% and 75% of the run, the
paper's epochs 80 and 120 of 160) or cosine (to ``lr_floor`` of the lr) learning rate with optional constant
warm-up. Before every
iteration the schedule gives the precision; BitOPs are counted per iteration from the actual batch size
(methods.md §2). After every epoch the model is evaluated on the validation split and the test set at the
precision in use, and the epoch's metrics leave only through ``report(metrics, save)``, where ``save(dir)``
writes a checkpoint that ``resume_from`` restores exactly.

``train_and_evaluate`` is a short sequence of named steps: load the data and any checkpoint, resolve CPT's
``fw_min: auto`` (the precision range test), build the ``Trainer`` (model, BitOPs counter, optimizer, runner),
restore it, then train epoch by epoch and summarise.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from engine import checkpoint, distributed, optim
from engine.config.experiment import ExperimentConfig, target_problems
from engine.cost.bitops import FW8BW8, BitOpsCounter, CostTotals
from engine.data.datasets import DataSplits, load_data
from engine.dfq.gated import GatedModel
from engine.dfq.gated_runner import GatedRunner
from engine.errors import CheckpointError, ConfigError, TrainingDiverged
from engine.metrics import (
    ACCURACY,
    CUM_CP,
    TRAIN_BITOPS,
    VAL_ACCURACY,
)
from engine.models import build_model
from engine.numerics.precision import FP32
from engine.run_metrics import cost_metrics, summarize, task_role
from engine.schedules.curves import PrecisionTrace, build_schedule
from engine.schedules.static_runner import StaticRunner, make_step

Reporter = Callable[[dict, Callable[[str | Path], Path]], None]
# an epoch's mean training loss above this many times chance's (ln of the classes, or of a vocabulary) is flagged
# as diverged: a loss that explodes without turning NaN is far past that, a slow start never reaches it
DIVERGENCE_FACTOR = 3.0


@dataclass
class RunResult:
    metrics: dict
    history: list[dict] = field(default_factory=list)


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError.single("device", name, "no CUDA GPU is visible to this process; allowed: auto or cpu")
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def prepare(cfg: ExperimentConfig, data_info, device: torch.device):
    """The model (gated for DFQ/FracTrain) with its layer map, and the BitOPs counter over the same map."""
    backbone = build_model(cfg.model.name, data_info.channels, data_info.classes, cfg.act_momentum)
    backbone.set_layer_map(cfg.layer_map_of(backbone))
    table = backbone.layer_table(data_info.input_shape(cfg.data.seq_len))
    counter = BitOpsCounter(table, backbone.layer_map, cfg.cost.models())
    model = backbone
    if cfg.gated:
        s = cfg.schedule
        model = GatedModel(backbone, s.option_precisions(cfg.model.name), s.execution, *s.gate_sizes(cfg.model.name),
                           s.routed_estimator, s.routed_sample_fraction, s.option_state,
                           s.routed_statistics, s.block_floor)
    return model.to(device), counter


@torch.no_grad()
def evaluate(model, logits_fn, split, batch_size: int, device: torch.device) -> tuple[float, float]:
    """(top-1 accuracy, mean CE loss) in eval mode (activations use their running range). On N workers each
    rank evaluates every N-th batch and the counts are summed: the whole split, once."""
    model.eval()
    world = distributed.current()
    correct, loss_sum, n = 0, 0.0, 0
    for i, (x, y) in enumerate(split.batches(batch_size, shuffle=False, augment=False, device=device)):
        if i % world.size != world.rank:
            continue
        logits = logits_fn(x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
        n += len(y)
    correct, loss_sum, n = world.sum([correct, loss_sum, n])
    model.train()
    return (correct / n if n else float("nan")), (loss_sum / n if n else float("nan"))


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(int(x) for x in state["python"]), None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_prt(cfg: ExperimentConfig, data, device: torch.device):
    """CPT's precision range test on a fresh model (seeded like the run); its BitOPs count in the run."""
    from engine.schedules.prt import precision_range_test

    seed_everything(cfg.seed)
    model, counter = prepare(cfg, data.info, device)
    opt = optim.for_config(cfg, model)
    sched = cfg.schedule

    def batches():
        epoch = 0
        while True:
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + 7919 + epoch)
            yield from data.train.batches(cfg.data.batch_size, True, cfg.data.augment, gen, device)
            epoch += 1

    result = precision_range_test(sched.prt, sched.fw_max, sched.weight_bits, batches, make_step(model, opt), counter)
    return result, counter


# ---------------------------------------------------------------------------------------------------
# the steps of train_and_evaluate


def load_resume_state(cfg: ExperimentConfig, resume_from, device: torch.device) -> dict | None:
    """The checkpoint to resume from, refused when another configuration wrote it."""
    if resume_from is None:
        return None
    state = checkpoint.load(resume_from, map_location=device, field="--resume")
    if state.get("config") != cfg.to_dict():
        raise CheckpointError(f"--resume: {resume_from} was written by a different configuration; refusing to "
                              "resume")
    return state


def resolve_fw_min(cfg: ExperimentConfig, data: DataSplits, device: torch.device, state: dict | None,
                   totals: CostTotals) -> dict | None:
    """CPT's ``fw_min: auto``: the precision range test's result (from the checkpoint when resuming; its
    BitOPs are added to the run's totals), else None."""
    if getattr(cfg.schedule, "fw_min", None) != "auto":
        return None
    if state is not None:
        return state["prt"]
    result, counter = run_prt(cfg, data, device)
    b = cfg.data.batch_size * task_role(cfg, data).predictions_per_sample  # an iteration's samples (LM: tokens)
    samples = result.iterations * b
    totals.add(result.bitops, samples * counter.fp32_per_sample(), samples * counter.fw8bw8_per_sample())
    totals.add_costs(result.costs, *({n: result.iterations * v for n, v in counter.costs(ref, b).items()}
                                     for ref in (FP32, FW8BW8)))
    return result.as_dict()


class Trainer:
    """The state of one run between epochs: model, optimizer, runner, BitOPs totals, history, position."""

    def __init__(self, cfg: ExperimentConfig, data: DataSplits, device: torch.device, totals: CostTotals,
                 prt_info: dict | None):
        self.cfg, self.data, self.device, self.totals, self.prt_info = cfg, data, device, totals, prt_info
        self.started, self.wall_before = time.perf_counter(), 0.0
        self.cpu_started, self.cpu_before = time.process_time(), 0.0
        seed_everything(cfg.seed)
        self.model, self.counter = prepare(cfg, data.info, device)
        self.role = task_role(cfg, data)
        self.run = cfg.run_length(len(data.train))
        self.opt = optim.for_config(cfg, self.model)
        if cfg.gated:
            self.runner = GatedRunner(cfg.schedule, self.model, self.counter, self.opt, self.run, cfg.model.name,
                                      self.role.predictions_per_sample)
            if problems := target_problems(cfg, self.runner.basis.reach()):  # the exact reach, now it is known
                raise ConfigError(problems)
        else:
            resolved = {} if prt_info is None else {"fw_min": int(prt_info["fw_min"])}
            self.runner = StaticRunner(build_schedule(cfg.schedule, self.run, **resolved), self.model, self.counter,
                                       self.opt, cfg.engine.compile)
        self.history: list[dict] = []
        self.epoch = self.iteration = 0
        self.bar = None
        self.init_metrics: dict = {}

    # -- resume ---------------------------------------------------------------------------------------
    def initialise(self, weights: dict) -> None:
        """Start from pretrained weights (``cfg.init``); their FP32 accuracy before any step is kept as
        ``init_accuracy`` / ``init_val_accuracy`` in the first epoch's metrics (proof that they were loaded)."""
        backbone = self.model.backbone if self.cfg.gated else self.model
        checkpoint.apply_init(backbone, weights, self.cfg.init)
        if self.cfg.gated:
            self.model.reset_option_state()  # per-option statistics start from the loaded ones
        size = self.cfg.data.eval_batch_size
        fp32 = lambda x: backbone(x, FP32)  # noqa: E731
        self.init_metrics = {"init_accuracy": evaluate(backbone, fp32, self.data.test, size, self.device)[0]}
        if self.data.val is not None:
            self.init_metrics["init_val_accuracy"] = evaluate(backbone, fp32, self.data.val, size, self.device)[0]

    def restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.runner.load_state_dict(state["schedule"])
        self.totals.load_state_dict(state["totals"])
        self.history = list(state["history"])
        self.epoch, self.iteration = int(state["epoch"]), int(state["iteration"])
        self.wall_before = float(state["wall_seconds"])
        self.cpu_before = float(state.get("cpu_seconds", 0.0))
        _set_rng_state(state["rng"])

    def snapshot(self, directory: str | Path) -> Path:
        return checkpoint.save(directory, {
            "config": self.cfg.to_dict(), "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
            "schedule": self.runner.state_dict(), "totals": self.totals.state_dict(), "history": self.history,
            "epoch": self.epoch, "iteration": self.iteration, "rng": _rng_state(), "prt": self.prt_info,
            "wall_seconds": self.wall_seconds(), "cpu_seconds": self.cpu_seconds(),
        })

    def wall_seconds(self) -> float:
        return self.wall_before + time.perf_counter() - self.started

    def cpu_seconds(self) -> float:
        """This process's CPU time (all threads) since the run started: a duration a shared machine's other
        load does not stretch, unlike ``wall_seconds``."""
        return self.cpu_before + time.process_time() - self.cpu_started

    # -- training -------------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.epoch >= self.run.epochs or self.iteration >= self.run.total_iterations

    def show_progress(self) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=self.run.total_iterations, initial=self.iteration, desc=self.cfg.name, unit="it",
                        dynamic_ncols=True, leave=False)

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
        """One iteration at the scheduled learning rate (with the config's fault injection, if any)."""
        lr = optim.lr_at(self.cfg, self.iteration, self.run.total_iterations)
        for group in self.opt.param_groups:
            group["lr"] = lr
        debug = self.cfg.debug
        seeds = debug.nan_loss_seeds
        if self.iteration == debug.nan_loss_at_iteration and (seeds is None or self.cfg.seed in seeds):
            x = torch.full_like(x, float("nan"))  # fault injection: the loss becomes NaN
        try:
            out = self.runner.step(x, y, self.iteration)
        except TrainingDiverged as err:
            raise TrainingDiverged(f"{err} (epoch {self.epoch + 1}, iteration {self.iteration})") from None
        if debug.sleep_per_iteration and (debug.sleep_while is None or os.path.exists(debug.sleep_while)):
            time.sleep(debug.sleep_per_iteration)
        return out

    def train_epoch(self) -> dict:
        """One epoch of training, then evaluation; returns the epoch's metrics (also kept in ``history``)."""
        cfg, runner, counter = self.cfg, self.runner, self.counter
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + self.epoch)
        trace, epoch_cost = PrecisionTrace(), CostTotals()
        loss_sum, correct, seen = 0.0, 0, 0
        events_before = len(runner.events)
        loop_started = time.perf_counter()
        world = distributed.current()  # N workers: the same global batches everywhere, each rank its slice
        for x, y in self.data.train.batches(cfg.data.batch_size * world.size, True, cfg.data.augment, gen,
                                            self.device, shards=world.size):
            if self.iteration >= self.run.total_iterations:
                break
            x, y = world.shard(x, y)
            loss_value, ok = self._step(x, y)  # the global batch's loss and number correct
            b = len(y) * world.size
            epoch_cost.add(runner.last_bitops, b * counter.fp32_per_sample(), b * counter.fw8bw8_per_sample())
            epoch_cost.add_costs(runner.last_costs, counter.costs(FP32, b), counter.costs(FW8BW8, b))
            trace.add(runner.last_fw, runner.last_bw)
            loss_sum, correct, seen = loss_sum + loss_value * b, correct + ok, seen + b
            self.iteration += 1
            if self.bar is not None:
                self.bar.update(1)
                self.bar.set_postfix(epoch=self.epoch + 1, loss=f"{loss_value:.3f}", fw=f"{runner.last_fw:.1f}",
                                     refresh=False)
        loop_seconds = time.perf_counter() - loop_started
        world.average_buffers(self.model)  # one set of running statistics before evaluation and checkpoints
        self.totals.merge(epoch_cost)
        self.epoch += 1
        fw_bits, bw_bits = trace.means()
        metrics = {
            "epoch": self.epoch,
            "iteration": self.iteration,
            "lr": optim.lr_at(cfg, self.iteration - 1, self.run.total_iterations),
            "loss": loss_sum / max(seen, 1),
            "train_accuracy": correct / max(seen, 1),
            **self.evaluate(),
            "step_bitops": epoch_cost.bitops / max(trace.n, 1),
            "epoch_gbitops": epoch_cost.bitops / 1e9,
            "cum_gbitops": self.totals.bitops / 1e9,
            TRAIN_BITOPS: float(self.totals.bitops),
            "cp": epoch_cost.cp,
            CUM_CP: self.totals.cp,
            **cost_metrics(epoch_cost, self.totals),
            "fw_bits": fw_bits,
            "bw_bits": bw_bits,
            "wall_seconds": self.wall_seconds(),
            "cpu_seconds": self.cpu_seconds(),
            **runner.end_epoch(),
            **(self.init_metrics if self.epoch == 1 else {}),
            "events": [dict(e, epoch=self.epoch) for e in runner.events[events_before:]],
        }
        # a loss that explodes without turning NaN: flagged, not stopped (methods.md §8)
        metrics["diverged"] = float(metrics["loss"] > DIVERGENCE_FACTOR * math.log(self.data.info.classes))
        metrics.update(self.role.epoch_metrics(seen, loop_seconds, epoch_cost))
        self.history.append(metrics)
        return metrics

    def evaluate(self) -> dict:
        """Validation and test accuracy and loss at the precision in use."""
        cfg, runner = self.cfg, self.runner
        batch = self.role.eval_batch_size(cfg.data.eval_batch_size)
        val_acc = val_loss = float("nan")
        if self.data.val is not None:
            val_acc, val_loss = evaluate(self.model, runner.eval_logits, self.data.val, batch, self.device)
        test_acc, test_loss = evaluate(self.model, runner.eval_logits, self.data.test, batch, self.device)
        out = {VAL_ACCURACY: val_acc, "val_loss": val_loss, ACCURACY: test_acc, "test_loss": test_loss}
        return {**out, **self.role.eval_metrics(val_loss, test_loss)}

    def result(self) -> RunResult:
        if self.bar is not None:
            self.bar.close()
        summary = summarize(self.cfg, self.history, self.totals, self.counter, self.wall_seconds())
        summary.update(self.role.summary(self.history, self.counter, summary))
        summary["events"] = [e for h in self.history for e in h["events"]]
        summary.update(self.runner.summary())
        if self.cfg.gated and self.history:
            last = self.history[-1]
            summary.update(target_cp=last["target_cp"], cp_last_epoch=last["cp_gated"],
                           bit_allocation=last["bit_allocation"])
        if self.prt_info is not None:
            summary["prt"] = self.prt_info
        return RunResult(summary, self.history)


def train_and_evaluate(
    cfg: ExperimentConfig,
    report: Reporter | None = None,
    resume_from: str | Path | None = None,
    progress: bool = False,
) -> RunResult:
    world = distributed.World()
    if world.size != cfg.workers:
        raise ConfigError.single("workers", cfg.workers, f"allowed: {world.size} (the processes of this run's "
                                 "torch.distributed group; one without a group)")
    with distributed.use(world):
        return _train(cfg, report, resume_from, progress)


def _train(cfg: ExperimentConfig, report: Reporter | None, resume_from, progress: bool) -> RunResult:
    device = pick_device(cfg.device)
    state = load_resume_state(cfg, resume_from, device)
    init_weights = checkpoint.load_init(cfg.init, cfg.model.name) if cfg.init and state is None else None
    data = load_data(cfg.data)
    totals = CostTotals()
    prt_info = resolve_fw_min(cfg, data, device, state, totals)
    trainer = Trainer(cfg, data, device, totals, prt_info)
    if state is not None:
        trainer.restore(state)
    elif init_weights is not None:
        trainer.initialise(init_weights)
    if progress:
        trainer.show_progress()
    while not trainer.finished:
        metrics = trainer.train_epoch()
        if report is not None:
            report(dict(metrics), trainer.snapshot)
    return trainer.result()
