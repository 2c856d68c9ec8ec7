"""Data-parallel runs (methods.md §12) in real processes of a gloo group: N workers at batch b follow one worker
at batch N * b, count the same BitOPs, and keep every rank's decisions identical."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.multiprocessing as mp

from engine.config.experiment import ExperimentConfig
from engine.errors import ConfigError
from engine.train import train_and_evaluate

# an even training set: N workers use an epoch cut to a multiple of N samples, one worker all of it
DIGITS = {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 32, "train_subset": 1280},
          "optim": {"epochs": 3}, "device": "cpu"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STATIC = {**DIGITS, "schedule": {"kind": "static", "fw": 8, "bw": 8}}
DFQ = {**DIGITS, "quant": {"layer_map": "gated"},
       "schedule": {"kind": "dfq", "options": "reference", "target_cp": 3.0, "execution": "routed",
                    "controller": "dual"}}


def _worker(rank: int, size: int, port: int, trees: list[dict], out: str) -> None:
    import torch.distributed as dist

    from engine.dfq.gated_runner import GatedRunner

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    prices: list[float] = []
    step = GatedRunner.step

    def recording(self, *a, **kw):
        result = step(self, *a, **kw)
        prices.append(self.controller.price)
        return result

    GatedRunner.step = recording
    try:
        for i, tree in enumerate(trees):  # one run after the other in the same group
            prices.clear()
            res = train_and_evaluate(ExperimentConfig.model_validate(tree))
            with open(f"{out}.{i}.{rank}", "w") as f:
                json.dump({"history": [{k: h[k] for k in ("loss", "accuracy", "train_bitops", "iteration")}
                                       | ({"cp_gated": h["cp_gated"]} if "cp_gated" in h else {})
                                       for h in res.history],
                           "prices": prices,
                           "metrics": {k: res.metrics[k] for k in ("train_bitops", "accuracy", "iterations")}}, f)
    finally:
        dist.destroy_process_group()


def run_workers(trees: list[dict], size: int, folder) -> list[list[dict]]:
    """Each run of ``trees`` on a gloo group of ``size`` processes (one group for all: each process imports torch
    once); per run, every rank's figures."""
    out = str(folder / "rank")
    mp.start_processes(_worker, args=(size, _free_port(), [{**t, "workers": size} for t in trees], out),
                       nprocs=size, start_method="spawn")
    return [[json.load(open(f"{out}.{i}.{r}")) for r in range(size)] for i in range(len(trees))]


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory) -> dict[str, list[dict]]:
    static, dfq = run_workers([STATIC, DFQ], 2, tmp_path_factory.mktemp("gloo"))
    return {"static": static, "dfq": dfq}


@pytest.mark.slow
def test_two_workers_at_batch_b_follow_one_worker_at_batch_2b_and_count_the_same_bitops(two_workers):
    """The same global batches in the same order: the loss follows within 5 % per epoch (each worker's
    BatchNorm and activation ranges see its half of a batch, so the runs are not bit-identical), the BitOPs
    are the same exactly, and both ranks report the same figures."""
    ranks = two_workers["static"]
    one = train_and_evaluate(ExperimentConfig.model_validate(
        {**STATIC, "data": {**STATIC["data"], "batch_size": 64}}))
    assert ranks[0] == ranks[1]  # every rank holds the same run
    two = ranks[0]["history"]
    assert [h["iteration"] for h in two] == [h["iteration"] for h in one.history]
    assert [h["train_bitops"] for h in two] == [h["train_bitops"] for h in one.history]
    for a, b in zip(two, one.history):
        assert a["loss"] == pytest.approx(b["loss"], rel=0.05)
    assert ranks[0]["metrics"]["accuracy"] == pytest.approx(one.metrics["accuracy"], abs=0.05)


@pytest.mark.slow
def test_routed_dfq_on_two_workers_holds_its_target_with_the_same_price_on_every_rank(two_workers):
    ranks = two_workers["dfq"]
    assert len(ranks[0]["prices"]) == ranks[0]["metrics"]["iterations"] > 0
    assert ranks[0]["prices"] == ranks[1]["prices"]  # every rank, every step
    assert ranks[0]["history"] == ranks[1]["history"]
    one = train_and_evaluate(ExperimentConfig.model_validate({**DFQ, "data": {**DFQ["data"], "batch_size": 64}}))
    last_two, last_one = ranks[0]["history"][-1]["cp_gated"], one.history[-1]["cp_gated"]
    assert abs(last_two - 3.0) <= max(0.3, 1.5 * abs(last_one - 3.0)), (last_two, last_one)


def test_a_run_refuses_a_worker_count_its_process_group_does_not_have():
    with pytest.raises(ConfigError, match="workers: got 2; allowed: 1"):
        train_and_evaluate(ExperimentConfig.model_validate({**DIGITS, "workers": 2}))
