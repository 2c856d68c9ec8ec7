"""What a run reports, by task: the per-epoch and evaluation metrics each task adds (a language model's
perplexity, tokens per second, BitOPs per token), every cost model's cumulative and per-epoch cost, and the run's
summary (``summarize``). ``engine.train``'s loop calls these; they read what it counted and compute nothing of
the training itself."""

from __future__ import annotations

import math

from engine.config.experiment import ExperimentConfig
from engine.cost.bitops import BitOpsCounter, CostTotals
from engine.data.datasets import DataSplits
from engine.metrics import (
    ACCURACY,
    COST_PREFIX,
    EPOCH_COST_PREFIX,
    FP32_BITOPS,
    FW8BW8_BITOPS,
    PERPLEXITY,
    TRAIN_BITOPS,
    VAL_ACCURACY,
    VAL_PERPLEXITY,
    Task,
    cost_key,
)
from engine.models import task_of


def perplexity(mean_ce: float) -> float:
    """exp of the mean token cross entropy (nats); inf past exp's range, NaN stays NaN."""
    return math.exp(mean_ce) if mean_ce < 700 else (mean_ce if math.isnan(mean_ce) else math.inf)


class ClassifierRole:
    """What the training loop does differently for each task (engine.metrics.Task), decided once per run: a
    classifier's sample is one prediction and its metrics are accuracies."""

    task = Task.CLASSIFIER
    predictions_per_sample = 1

    def __init__(self, cfg: ExperimentConfig, data: DataSplits):
        self.cfg, self.data = cfg, data

    def eval_batch_size(self, batch: int) -> int:
        return batch

    def epoch_metrics(self, seen: int, loop_seconds: float, epoch_cost: CostTotals) -> dict:
        return {}

    def eval_metrics(self, val_loss: float, test_loss: float) -> dict:
        return {}

    def summary(self, history: list[dict], counter: BitOpsCounter, summary: dict) -> dict:
        return {}


class LanguageModelRole(ClassifierRole):
    """A language model's sample is a sequence of predicted tokens (its accuracy is next-token accuracy); it
    also reports perplexity = exp(mean CE), tokens per second and BitOPs per token."""

    task = Task.LANGUAGE_MODEL

    def __init__(self, cfg: ExperimentConfig, data: DataSplits):
        super().__init__(cfg, data)
        self.predictions_per_sample = cfg.data.seq_len

    def eval_batch_size(self, batch: int) -> int:
        # at most 2^28 logits (1 GiB) a batch: WikiText-103's vocabulary is 267,735
        return max(1, min(batch, 2**28 // (self.cfg.data.seq_len * self.data.info.classes)))

    def epoch_metrics(self, seen: int, loop_seconds: float, epoch_cost: CostTotals) -> dict:
        # seen counts predicted tokens (y is flattened)
        return {"tokens": seen, "train_seconds": loop_seconds, "tokens_per_second": seen / max(loop_seconds, 1e-9),
                "bitops_per_token": epoch_cost.bitops / max(seen, 1)}

    def eval_metrics(self, val_loss: float, test_loss: float) -> dict:
        return {VAL_PERPLEXITY: perplexity(val_loss), PERPLEXITY: perplexity(test_loss)}

    def summary(self, history: list[dict], counter: BitOpsCounter, summary: dict) -> dict:
        return lm_summary(history, self.data, counter, summary)


def task_role(cfg: ExperimentConfig, data: DataSplits) -> ClassifierRole:
    return (LanguageModelRole if task_of(cfg.model.name) is Task.LANGUAGE_MODEL else ClassifierRole)(cfg, data)


def lm_summary(history: list[dict], data: DataSplits, counter: BitOpsCounter, summary: dict) -> dict:
    """A language model's figures: test and validation perplexity (last epoch), the best validation perplexity,
    the unigram baseline, vocabulary, tokens per second of training and training BitOPs per token (a "sample"
    of the counter is one predicted token)."""
    last = history[-1] if history else {}
    val = [h[VAL_PERPLEXITY] for h in history if not math.isnan(h.get(VAL_PERPLEXITY, math.nan))]
    trained = sum(h.get("tokens", 0) for h in history)
    seconds = sum(h.get("train_seconds", 0.0) for h in history)
    return {
        "task": Task.LANGUAGE_MODEL.value,
        PERPLEXITY: last.get(PERPLEXITY, math.nan),
        VAL_PERPLEXITY: last.get(VAL_PERPLEXITY, math.nan),
        "best_val_perplexity": min(val) if val else math.nan,
        "test_loss": last.get("test_loss", math.nan),
        "unigram_perplexity": data.unigram_perplexity,
        "vocab_size": data.info.classes,
        "seq_len": data.train.seq_len,
        "train_tokens": trained,
        "tokens_per_second": trained / seconds if seconds else math.nan,  # the training loops, evaluation excluded
        "bitops_per_token": summary[TRAIN_BITOPS] / trained if trained else math.nan,
        "forward_macs_per_token": counter.forward_macs,
    }


def cost_metrics(epoch: CostTotals, totals: CostTotals) -> dict:
    """Every cost model's cumulative (``train_cost_<model>``) and per-epoch (``epoch_cost_<model>``) training
    cost, the flat numeric metrics the tracker logs (BitOPs keep their own keys: ``train_bitops``...)."""
    out = {}
    for name, (run, _, _) in totals.models.items():
        if name != "bitops":
            key = cost_key(name)
            out[key] = float(run)
            out[EPOCH_COST_PREFIX + key.removeprefix(COST_PREFIX)] = float(epoch.models.get(name, [0])[0])
    return out


def summarize(cfg: ExperimentConfig, history: list[dict], totals: CostTotals, counter: BitOpsCounter,
              wall: float) -> dict:
    last = history[-1] if history else {}
    units = {m.name: m.unit for m in counter.models}
    val = [h[VAL_ACCURACY] for h in history if not math.isnan(h[VAL_ACCURACY])]
    best_epoch = (max(range(len(history)), key=lambda i: history[i][VAL_ACCURACY]) + 1) if val else None
    return {
        "name": cfg.name,
        "seed": cfg.seed,
        "workers": cfg.workers,
        "model": cfg.model.name,
        "dataset": cfg.data.dataset,
        "schedule": cfg.schedule.kind,
        ACCURACY: last.get(ACCURACY, float("nan")),
        VAL_ACCURACY: last.get(VAL_ACCURACY, float("nan")),
        "best_val_accuracy": max(val) if val else float("nan"),
        "best_epoch": best_epoch,
        "epochs": last.get("epoch", 0),
        "iterations": last.get("iteration", 0),
        TRAIN_BITOPS: float(totals.bitops),
        FP32_BITOPS: float(totals.fp32),
        FW8BW8_BITOPS: float(totals.fw8bw8),
        "train_gbitops": totals.bitops / 1e9,
        "savings_vs_fp32": totals.savings_vs_fp32,
        "savings_vs_fw8bw8": totals.savings_vs_fw8bw8,
        "cp": totals.cp,
        "forward_macs_per_sample": counter.forward_macs,
        "wall_seconds": wall,
        "cpu_seconds": last.get("cpu_seconds", float("nan")),
        **{k: v for k, v in (history[0] if history else {}).items() if k.startswith("init_")},
        **{cost_key(n): v["total"] for n, v in totals.model_summary().items() if n != "bitops"},
        "costs": {n: {**v, "unit": units.get(n, "")} for n, v in totals.model_summary().items()},
    }
