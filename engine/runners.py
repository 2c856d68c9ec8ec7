"""How one training iteration runs for each method family, behind one interface the training loop uses.

``StaticRunner`` (fp32, static, PFQ, CPT): the schedule gives the precision before the iteration and observes
the CE loss after it; the whole batch runs at that precision. ``engine.dfq.GatedRunner`` (DFQ, FracTrain):
the gate picks per input and block. Both expose ``step(x, y, iteration) -> (CE loss, correct)``, the exact
BitOPs of the last step (``last_bitops``) and its cost under every cost model (``last_costs``), the mean FW/BW bits it used, ``eval_logits``, ``end_epoch()``
metrics, ``events``, ``summary()`` and ``state_dict()``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.cost import BitOpsCounter
from engine.errors import TrainingDiverged
from engine.precision import Precision


def sgd_step(opt: torch.optim.Optimizer, loss: torch.Tensor, ce: torch.Tensor) -> float:
    """The optimizer block of every method: backward of ``loss``, one step; returns the CE's value. Raises
    ``TrainingDiverged`` on a NaN/inf CE before touching the parameters."""
    value = ce.item()
    if not math.isfinite(value):
        raise TrainingDiverged(f"training loss is {value}")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return value


def make_step(model, opt: torch.optim.Optimizer):
    """One SGD iteration at ``prec``: returns (CE loss value, number correct). Raises on a NaN/inf loss."""

    def step(x: torch.Tensor, y: torch.Tensor, prec: Precision) -> tuple[float, int]:
        logits = model(x, prec)
        loss = F.cross_entropy(logits, y)
        try:
            value = sgd_step(opt, loss, loss)
        except TrainingDiverged as err:
            raise TrainingDiverged(f"{err} at precision {prec}") from None
        return value, int((logits.argmax(1) == y).sum())

    return step


class StaticRunner:
    def __init__(self, schedule, model, counter: BitOpsCounter, opt: torch.optim.Optimizer):
        self.schedule, self.model, self.counter = schedule, model, counter
        self._step = make_step(model, opt)
        self.last_bitops, self.last_fw, self.last_bw = 0, 0.0, 0.0
        self.last_costs: dict[str, float] = {}
        self._last_iteration = 0

    @property
    def events(self) -> list[dict]:
        return self.schedule.events

    def step(self, x: torch.Tensor, y: torch.Tensor, iteration: int) -> tuple[float, int]:
        prec = self.schedule.precision(iteration)
        loss, correct = self._step(x, y, prec)
        self.schedule.observe(iteration, loss)
        self.last_bitops = len(y) * self.counter.per_sample(prec)
        self.last_costs = self.counter.costs(prec, len(y))
        self.last_fw, self.last_bw = float(prec.act), float(prec.grad)
        self._last_iteration = iteration
        return loss, correct

    def eval_logits(self, x: torch.Tensor) -> torch.Tensor:
        # the precision in use at the end of training so far (the reference evaluates at the current bits)
        return self.model(x, self.schedule.precision(self._last_iteration))

    def end_epoch(self) -> dict:
        return self.schedule.epoch_metrics()

    def summary(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {**self.schedule.state_dict(), "last_iteration": self._last_iteration}

    def load_state_dict(self, state: dict) -> None:
        self.schedule.load_state_dict(state)
        self._last_iteration = int(state.get("last_iteration", 0))
