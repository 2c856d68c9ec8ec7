"""The one training loop: ``train_and_evaluate(cfg, report) -> RunResult`` (architecture rule 6).

SGD (momentum 0.9, weight decay 1e-4 on all parameters), a piecewise (/10 at 50% and 75% of the run, the
paper's epochs 80 and 120 of 160) or cosine learning rate with optional constant warm-up (algorithms.md 8).
Before every iteration the schedule gives the precision; BitOPs are counted per iteration from the actual
batch size (algorithms.md 6.4.1). After every epoch the model is evaluated on the validation split and the
test set at the precision in use, and the epoch's metrics leave only through ``report(metrics, save)``,
where ``save(dir)`` writes a checkpoint that ``resume_from`` restores exactly.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from engine import checkpoint
from engine.config import ExperimentConfig
from engine.cost import BitOpsCounter, CostTotals
from engine.data import load_data
from engine.dfq import GatedRunner
from engine.errors import CheckpointError, TrainingDiverged
from engine.models import build_model
from engine.models.gated import GatedModel
from engine.runners import StaticRunner, make_step
from engine.schedules import PrecisionTrace, ScheduleContext, build_schedule

Reporter = Callable[[dict, Callable[[str | Path], Path]], None]


@dataclass
class RunResult:
    metrics: dict
    history: list[dict] = field(default_factory=list)


def lr_at(cfg: ExperimentConfig, iteration: int, total: int) -> float:
    o = cfg.optim
    if iteration < o.warmup_iters:
        return o.warmup_lr
    if o.lr_schedule == "constant":
        return o.lr
    if o.lr_schedule == "cosine":
        return 0.5 * o.lr * (1.0 + math.cos(math.pi * iteration / total))
    drops = sum(1 for m in o.milestones if iteration >= round(m * total))
    return o.lr * (o.gamma ** drops)


def pick_device(name: str) -> torch.device:
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def prepare(cfg: ExperimentConfig, data_info, device: torch.device):
    """The model (gated for DFQ/FracTrain) with its layer map, and the BitOPs counter over the same map."""
    backbone = build_model(cfg.model.name, data_info.channels, data_info.classes, cfg.quant.act_momentum)
    backbone.set_layer_map(cfg.layer_map(stem_default=backbone.stem_quantized_by_default))
    table = backbone.layer_table((data_info.channels, data_info.size, data_info.size))
    counter = BitOpsCounter(table, backbone.layer_map)
    model = backbone
    if cfg.gated:
        s = cfg.schedule
        model = GatedModel(backbone, s.option_precisions(cfg.model.name), s.execution, s.gate_dim, s.embed_dim,
                           s.hidden_dim)
    return model.to(device), counter


@torch.no_grad()
def evaluate(model, logits_fn, split, batch_size: int, device: torch.device) -> tuple[float, float]:
    """(top-1 accuracy, mean CE loss) in eval mode (activations use their running range)."""
    model.eval()
    correct, loss_sum, n = 0, 0.0, 0
    for x, y in split.batches(batch_size, shuffle=False, augment=False, device=device):
        logits = logits_fn(x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
        n += len(y)
    model.train()
    return (correct / n if n else float("nan")), (loss_sum / n if n else float("nan"))


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]), "numpy_seed": None}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_optimizer(cfg: ExperimentConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum,
                           weight_decay=cfg.optim.weight_decay, nesterov=cfg.optim.nesterov)


def run_prt(cfg: ExperimentConfig, data, device: torch.device):
    """CPT's precision range test on a fresh model (seeded like the run); its BitOPs count in the run."""
    from engine.prt import precision_range_test

    seed_everything(cfg.seed)
    model, counter = prepare(cfg, data.info, device)
    opt = make_optimizer(cfg, model)
    sched = cfg.schedule

    def batches():
        epoch = 0
        while True:
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + 7919 + epoch)
            yield from data.train.batches(cfg.data.batch_size, True, cfg.data.augment, gen, device)
            epoch += 1

    result = precision_range_test(sched.prt, sched.fw_max, sched.weight_bits, batches, make_step(model, opt), counter)
    return result, counter


def train_and_evaluate(
    cfg: ExperimentConfig,
    report: Reporter | None = None,
    resume_from: str | Path | None = None,
    progress: bool = False,
) -> RunResult:
    started = time.perf_counter()
    device = pick_device(cfg.device)
    data = load_data(cfg.data)
    state = checkpoint.load(resume_from, map_location=device) if resume_from is not None else None
    if state is not None and state["config"] != cfg.to_dict():
        raise CheckpointError("checkpoint: it was written by a different configuration; refusing to resume")

    totals = CostTotals()
    resolved: dict = {}
    prt_info = None
    if getattr(cfg.schedule, "fw_min", None) == "auto":
        if state is not None:
            prt_info = state["prt"]
        else:
            result, prt_counter = run_prt(cfg, data, device)
            prt_info = result.as_dict()
            totals.add(result.bitops, result.iterations * cfg.data.batch_size * prt_counter.fp32_per_sample(),
                       result.iterations * cfg.data.batch_size * prt_counter.fw8bw8_per_sample())
        resolved["fw_min"] = int(prt_info["fw_min"])

    seed_everything(cfg.seed)
    model, counter = prepare(cfg, data.info, device)
    ipe = math.ceil(len(data.train) / cfg.data.batch_size)
    total = cfg.optim.iterations or cfg.optim.epochs * ipe
    epochs = math.ceil(total / ipe)
    ctx = ScheduleContext(total, ipe)
    opt = make_optimizer(cfg, model)
    if cfg.gated:
        runner = GatedRunner(cfg.schedule, model, counter, opt, ctx, cfg.model.name)
    else:
        runner = StaticRunner(build_schedule(cfg.schedule, ctx, **resolved), model, counter, opt)
    history: list[dict] = []
    epoch, iteration, wall_before = 0, 0, 0.0

    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        runner.load_state_dict(state["schedule"])
        totals.load_state_dict(state["totals"])
        history = list(state["history"])
        epoch, iteration, wall_before = int(state["epoch"]), int(state["iteration"]), float(state["wall_seconds"])
        _set_rng_state(state["rng"])

    def snapshot(directory: str | Path) -> Path:
        return checkpoint.save(directory, {
            "config": cfg.to_dict(), "model": model.state_dict(), "optimizer": opt.state_dict(),
            "schedule": runner.state_dict(), "totals": totals.state_dict(), "history": history,
            "epoch": epoch, "iteration": iteration, "rng": _rng_state(), "prt": prt_info,
            "wall_seconds": wall_before + time.perf_counter() - started,
        })

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=iteration, desc=cfg.name, unit="it", dynamic_ncols=True, leave=False)

    model.train()
    while epoch < epochs and iteration < total:
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch)
        trace, epoch_cost = PrecisionTrace(), CostTotals()
        loss_sum, correct, seen = 0.0, 0, 0
        events_before = len(runner.events)
        for x, y in data.train.batches(cfg.data.batch_size, True, cfg.data.augment, gen, device):
            if iteration >= total:
                break
            lr = lr_at(cfg, iteration, total)
            for group in opt.param_groups:
                group["lr"] = lr
            try:
                if iteration == cfg.debug.nan_loss_at_iteration:
                    x = torch.full_like(x, float("nan"))  # fault injection: the loss becomes NaN
                loss_value, ok = runner.step(x, y, iteration)
            except TrainingDiverged as err:
                raise TrainingDiverged(f"{err} (epoch {epoch + 1}, iteration {iteration})") from None
            if cfg.debug.sleep_per_iteration:
                time.sleep(cfg.debug.sleep_per_iteration)
            b = len(y)
            epoch_cost.add(runner.last_bitops, b * counter.fp32_per_sample(), b * counter.fw8bw8_per_sample())
            trace.add(runner.last_fw, runner.last_bw)
            loss_sum += loss_value * b
            correct += ok
            seen += b
            iteration += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(epoch=epoch + 1, loss=f"{loss_value:.3f}", fw=f"{runner.last_fw:.1f}", refresh=False)
        totals.add(epoch_cost.bitops, epoch_cost.fp32, epoch_cost.fw8bw8)
        val_acc, val_loss = (evaluate(model, runner.eval_logits, data.val, cfg.data.eval_batch_size, device)
                             if data.val is not None else (float("nan"), float("nan")))
        test_acc, test_loss = evaluate(model, runner.eval_logits, data.test, cfg.data.eval_batch_size, device)
        epoch += 1
        fw_bits, bw_bits = trace.means()
        metrics = {
            "epoch": epoch,
            "iteration": iteration,
            "lr": lr_at(cfg, iteration - 1, total),
            "loss": loss_sum / max(seen, 1),
            "train_accuracy": correct / max(seen, 1),
            "val_accuracy": val_acc,
            "val_loss": val_loss,
            "accuracy": test_acc,
            "test_loss": test_loss,
            "step_bitops": epoch_cost.bitops / max(trace.n, 1),
            "epoch_gbitops": epoch_cost.bitops / 1e9,
            "cum_gbitops": totals.bitops / 1e9,
            "train_bitops": float(totals.bitops),
            "cp": epoch_cost.cp,
            "cum_cp": totals.cp,
            "fw_bits": fw_bits,
            "bw_bits": bw_bits,
            "wall_seconds": wall_before + time.perf_counter() - started,
            **runner.end_epoch(),
            "events": [dict(e, epoch=epoch) for e in runner.events[events_before:]],
        }
        history.append(metrics)
        if report is not None:
            report(dict(metrics), snapshot)
    if bar is not None:
        bar.close()
    summary = summarize(cfg, history, totals, counter, wall_before + time.perf_counter() - started)
    summary["events"] = [e for h in history for e in h["events"]]
    summary.update(runner.summary())
    if cfg.gated and history:
        last = history[-1]
        summary.update(target_cp=last["target_cp"], cp_last_epoch=last["cp_gated"],
                       bit_allocation=last["bit_allocation"])
    if prt_info is not None:
        summary["prt"] = prt_info
    return RunResult(summary, history)


def summarize(cfg: ExperimentConfig, history: list[dict], totals: CostTotals, counter: BitOpsCounter,
              wall: float) -> dict:
    last = history[-1] if history else {}
    val = [h["val_accuracy"] for h in history if not math.isnan(h["val_accuracy"])]
    best_epoch = (max(range(len(history)), key=lambda i: history[i]["val_accuracy"]) + 1) if val else None
    return {
        "name": cfg.name,
        "seed": cfg.seed,
        "model": cfg.model.name,
        "dataset": cfg.data.dataset,
        "schedule": cfg.schedule.kind,
        "accuracy": last.get("accuracy", float("nan")),
        "val_accuracy": last.get("val_accuracy", float("nan")),
        "best_val_accuracy": max(val) if val else float("nan"),
        "best_epoch": best_epoch,
        "epochs": last.get("epoch", 0),
        "iterations": last.get("iteration", 0),
        "train_bitops": float(totals.bitops),
        "fp32_bitops": float(totals.fp32),
        "fw8bw8_bitops": float(totals.fw8bw8),
        "train_gbitops": totals.bitops / 1e9,
        "savings_vs_fp32": totals.savings_vs_fp32,
        "savings_vs_fw8bw8": totals.savings_vs_fw8bw8,
        "cp": totals.cp,
        "forward_macs_per_sample": counter.forward_macs,
        "wall_seconds": wall,
    }
