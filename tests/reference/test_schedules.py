"""The precision schedules beside the reference's training scripts: CPT's cyclic precision (cpt_cifar/train.py)
and PFQ's loss indicator (fractrain_cifar/train_pfq.py), iteration by iteration and window by window."""

from __future__ import annotations

import contextlib
import io
import random

import pytest

from engine.config.experiment import parse_config
from engine.config.schedule import CPTSchedule, PFQSchedule
from engine.optim import lr_at
from engine.preview import preview
from engine.run_length import RunLength
from engine.schedules.curves import CPT, AutoPFQ, ManualPFQ
from engine.schedules.indicator import LossIndicator
from tests.reference import REFERENCE_CODE_WARNINGS
from tests.reference.upstream.cpt_loops import cpt_bits, cpt_cost_ratio
from tests.reference.upstream.fractrain_loops import pfq_manual_bits, pfq_run_indicator, reference_lr

pytestmark = REFERENCE_CODE_WARNINGS


def _engine_bits(iters: int, cycles: int, fw: tuple[int, int], bw: tuple[int, int]) -> list[tuple[int, int]]:
    cpt = CPT(CPTSchedule(fw_min=fw[0], fw_max=fw[1], bw_min=bw[0], bw_max=bw[1], num_cycles=cycles),
              RunLength(iters, 100))
    return [(p.act, p.grad) for p in map(cpt.precision, range(iters))]


@pytest.mark.parametrize(("iters", "cycles", "fw", "bw"), [
    (64000, 32, (3, 8), (8, 8)),  # the paper's CIFAR setting
    (64000, 32, (4, 8), (6, 8)),
    (1200, 8, (2, 8), (4, 8)),  # a range of 6: the exact value is a half at a third and two thirds of a cycle
    (640, 4, (3, 16), (8, 16)),
    (4004, 7, (2, 8), (6, 12)),
])
def test_cpt_trains_each_iteration_at_the_references_bits(iters, cycles, fw, bw):
    """Where the cycles divide the run, every iteration's (FW, BW) is the reference's, including those where
    the exact value is halfway between two widths and rint's pick depends on how the cosine is written."""
    assert _engine_bits(iters, cycles, fw, bw) == cpt_bits(iters, cycles, fw, bw)


def test_cpt_with_a_remainder_departs_only_as_documented():
    """methods.md §9, row 9: with a remainder the reference's ``int(iters / cycles)`` period starts an extra,
    partial cycle, so its last iterations run at ``fw_min``; the engine's cycles tile the run. With the same
    period the two agree again."""
    iters, cycles = 1000, 3
    ref, ours = cpt_bits(iters, cycles, (3, 8), (8, 8)), _engine_bits(iters, cycles, (3, 8), (8, 8))
    assert ref[-1][0] == 3 and ours[-1][0] == 8  # the reference ends a run at the bottom of a cycle
    assert ref != ours
    # the reference's own period, 333 iterations, in the engine: 3 cycles of a 999-iteration run
    assert _engine_bits(999, cycles, (3, 8), (8, 8)) == ref[:999]


def _losses(rng: random.Random) -> list[float]:
    """A run's window losses: a noisy decay of random depth, speed and noise, sometimes with plateaus."""
    n = rng.randint(5, 80)
    start, decay, noise = rng.uniform(0.5, 3.0), rng.uniform(0.0, 0.2), rng.uniform(0.0, 0.1)
    flat_from = rng.randint(1, n)  # the decay stops here: a plateau the indicator should find
    return [start * (1 - decay) ** min(e, flat_from) + rng.gauss(0, noise) * start for e in range(n)]


def test_the_loss_indicator_fires_where_the_references_does():
    """The reference's indicator class and the lines of its loop around it (the loss scale over the first ten
    windows, no check after the last turning point, the threshold decayed after the first and second) against
    ``LossIndicator``, over 1,500 random runs and settings: the same turning points, window for window."""
    rng = random.Random(0)
    fired = 0
    for _ in range(1500):
        losses = _losses(rng)
        eps, alpha = rng.choice([0.05, 0.1, 0.15, 0.3]), rng.choice([0.3, 0.4, 0.5, 1.0])
        turns = rng.randint(1, 4)
        with contextlib.redirect_stdout(io.StringIO()):  # the reference prints its distances
            expected = pfq_run_indicator(losses, eps, alpha, turns)
        indicator = LossIndicator(eps, alpha, turns)
        assert [e for e, loss in enumerate(losses, start=1) if indicator.update(loss)] == expected
        fired += len(expected)
    assert fired > 1000  # the runs exercise the indicator, not only its silence


def test_auto_pfq_switches_stage_where_the_reference_does():
    """A run of auto PFQ fed the same per-iteration losses: a turning point found at the end of a window
    applies from the next iteration, and each stage trains at the reference's ``num_bits_schedule[c]`` /
    ``num_grad_bits_schedule[c]`` (train_pfq.py's ``adaptive_adjust_precision``)."""
    fw, bw, every = [3, 4, 6, 8], [6, 6, 8, 8], 20
    rng = random.Random(1)
    losses = [2.0 * 0.8 ** min(e, 6) + rng.gauss(0, 0.002) for e in range(30)]  # 30 windows
    with contextlib.redirect_stdout(io.StringIO()):
        turns = pfq_run_indicator(losses, 0.05, 0.3, 3)
    assert len(turns) == 3
    sched = AutoPFQ(PFQSchedule(fw=fw, bw=bw, epsilon=0.05, alpha=0.3, eval_every=every),
                    RunLength(30 * every, 100))
    stage_of = [sum(1 for t in turns if it >= t * every) for it in range(30 * every)]
    for it in range(30 * every):
        prec = sched.precision(it)
        assert (prec.act, prec.grad, prec.weight) == (fw[stage_of[it]], bw[stage_of[it]], fw[stage_of[it]]), it
        sched.observe(it, losses[it // every])


def test_the_learning_rate_is_the_references_at_every_iteration():
    """The papers' 64,000 iterations: piecewise with the reference's ``--warm_up`` (0.01 for 400 iterations, then
    0.1, divided by 10 at 32,000 and 48,000) equal to the bit; the cosine to ``lr * step_ratio^2`` within 1e-8
    (the reference writes pi as 3.141592653)."""
    total = 64000

    def engine(optim: dict):
        cfg = parse_config({"model": {"name": "resnet38"}, "data": {"dataset": "cifar10"}, "optim": optim})
        return [lr_at(cfg, i, total) for i in range(total)]

    ref = reference_lr("piecewise", 0.1, total, warm_up=True)
    assert engine({"lr": 0.1, "warmup_iters": 400, "warmup_lr": 0.01}) == [ref(i) for i in range(total)]
    ref = reference_lr("anneal_cosine", 0.1, total, warm_up=False)
    ours = engine({"lr": 0.1, "lr_schedule": "cosine"})
    assert max(abs(a - ref(i)) / ref(i) for i, a in enumerate(ours)) < 1e-8


@pytest.mark.parametrize(("fw", "bw"), [((3, 8), (8, 8)), ((4, 8), (6, 8))])
def test_a_cpt_runs_cost_ratio_is_the_references(fw, bw):
    """The mean over the run of ``(a^2 + 2 a g) / 3072`` that CPT's script logs as its cost ratio, against
    ``fractune schedule``'s global ratio (every layer at the schedule's bits, methods.md §2) for 64,000
    iterations in 32 cycles: the same number. (The run's own cp counts every layer at the bits it really runs,
    the stem and FC included: methods.md §9, row 6.)"""
    cfg = parse_config({"model": {"name": "resnet38"}, "data": {"dataset": "cifar10"}, "optim": {"iterations": 64000},
                        "schedule": {"kind": "cpt", "fw_min": fw[0], "fw_max": fw[1], "bw_min": bw[0],
                                     "bw_max": bw[1], "num_cycles": 32}})
    assert preview(cfg)["cost_ratio_vs_fp32"] == pytest.approx(cpt_cost_ratio(64000, 32, fw, bw), rel=1e-12)


def test_manual_pfq_switches_at_the_references_iterations():
    """``--schedule 16000 32000 48000`` over 64,000 iterations as ``switch_at: [0.25, 0.5, 0.75]``: every
    iteration at the reference's bits, the switch iteration itself at the new stage's."""
    fw, bw = [3, 4, 6, 8], [6, 6, 8, 8]
    ours = ManualPFQ(PFQSchedule(fw=fw, bw=bw, mode="manual", switch_at=[0.25, 0.5, 0.75]), RunLength(64000, 100))
    expected = pfq_manual_bits(64000, [16000, 32000, 48000], fw, bw)
    assert [(p.act, p.grad) for p in map(ours.precision, range(64000))] == expected


def test_the_evaluation_at_a_pfq_turning_point_runs_at_the_bits_its_epoch_trained_at():
    """train_pfq.py validates, then updates the indicator: the evaluation at the end of the window that fires a
    turning point runs at the old stage's bits, the new ones train from the next iteration (methods.md §4.3).
    One-epoch windows (the ImageNet script's) and a flat loss fire it at an epoch's end; that epoch's
    evaluation, and the same evaluation from the state a checkpoint keeps, use the old bits."""
    import torch

    from engine.cost.bitops import CostTotals
    from engine.data.datasets import load_data
    from engine.train import Trainer

    cfg = parse_config({"model": {"name": "tiny"}, "optim": {"epochs": 8, "lr": 1e-9},
                        "data": {"dataset": "digits", "batch_size": 64, "train_subset": 256, "test_subset": 64},
                        "schedule": {"kind": "pfq", "fw": [3, 4, 6, 8], "bw": [6, 6, 8, 8], "eval_every": 1,
                                     "eval_unit": "epochs"}})
    data = load_data(cfg.data)
    trainer = Trainer(cfg, data, torch.device("cpu"), CostTotals(), None)
    runner = trainer.runner
    while not runner.events and trainer.epoch < cfg.optim.epochs:
        trainer.train_epoch()
    assert [e["iteration"] for e in runner.events] == [trainer.iteration]  # fired at this epoch's end
    old, new = (runner.schedule.cfg.stage_precision(s) for s in (0, 1))
    x, _ = next(data.test.batches(32, False, False))
    trainer.model.eval()
    with torch.no_grad():
        at_old, at_new = trainer.model(x, old), trainer.model(x, new)
        assert not torch.equal(at_old, at_new)
        assert torch.equal(runner.eval_logits(x), at_old)
        state = runner.state_dict()
        runner._trained = None
        runner.load_state_dict(state)
        assert torch.equal(runner.eval_logits(x), at_old)
