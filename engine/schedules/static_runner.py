"""How one training iteration runs for each method family, behind one interface the training loop uses.

``StaticRunner`` (fp32, static, PFQ, CPT): the schedule gives the precision before the iteration and observes
the CE loss after it; the whole batch runs at that precision. ``engine.dfq.gated_runner.GatedRunner`` (DFQ, FracTrain):
the gate picks per input and block. Both expose ``step(x, y, iteration) -> (CE loss, correct)``, the exact
BitOPs of the last step (``last_bitops``) and its cost under every cost model (``last_costs``), the mean FW/BW bits it used, ``eval_logits``, ``end_epoch()``
metrics, ``events``, ``summary()`` and ``state_dict()``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine import distributed
from engine.cost.bitops import BitOpsCounter
from engine.errors import TrainingDiverged
from engine.numerics.precision import Precision
from engine.optim import Optimizer


def sgd_step(opt: Optimizer, loss: torch.Tensor, ce: torch.Tensor | float) -> float:
    """The optimizer block of every method: backward of ``loss``, one step; returns the CE's value (``ce``: the
    tensor, or its value already read). Raises ``TrainingDiverged`` on a NaN/inf CE before touching the
    parameters."""
    value = ce.item() if isinstance(ce, torch.Tensor) else ce
    if not math.isfinite(value):
        raise TrainingDiverged(f"training loss is {value}")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    distributed.current().average_gradients(p for group in opt.param_groups for p in group["params"])
    opt.step()
    return value


def make_step(model, opt: Optimizer, graphs: bool = False):
    """One SGD iteration at ``prec``: returns (CE loss value, number correct). Raises on a NaN/inf loss.
    ``graphs``: ``model`` replays CUDA graphs (``engine.compile: reduce-overhead``); each step starts a new
    iteration of them, so a replay may reuse the memory of the last step's outputs."""

    def step(x: torch.Tensor, y: torch.Tensor, prec: Precision) -> tuple[float, int]:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        logits = model(x, prec)
        loss = F.cross_entropy(logits, y)
        # the loss and the count in one read: each read makes the host wait for the device
        value, correct = torch.stack([loss.detach(), (logits.argmax(1) == y).sum().to(loss.dtype)]).tolist()
        world = distributed.current()
        if world.on:  # the global batch's loss: every rank's schedule and NaN check see the same value
            total, correct, n = world.sum([value * len(y), correct, len(y)])
            value = total / n
        try:
            sgd_step(opt, loss, value)
        except TrainingDiverged as err:
            raise TrainingDiverged(f"{err} at precision {prec}") from None
        return value, int(correct)

    return step


RECOMPILE_LIMIT = 64  # a guard on a bypassed (32-bit) component, a batch shape: each may add a graph


def compiled(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """``model`` for the training step under ``engine.compile`` (methods.md §1, "Captured steps"): itself when
    off, else ``torch.compile``d (``reduce-overhead``: replayed as CUDA graphs on a GPU). The first precision
    compiles a graph specialised on its bit-widths; the first change of a bit-width compiles one more, in which
    the bit-widths are symbolic integers (torch.compile's automatic dynamic), and every later precision reuses
    it: a CPT cycle or PFQ's stages compile two graphs, not one per bit-width."""
    if mode == "off":
        return model
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # older torch
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    _key_cpu_kernels_by_isa()
    return torch.compile(model, mode=None if mode == "default" else mode)


def _key_cpu_kernels_by_isa() -> None:
    """Make Inductor's cache tell CPU vector widths apart. Its C++ kernels are generated for the vector ISA it
    picks (``ATEN_CPU_CAPABILITY`` lowers it, as docs/usage.md's pins do), but its graph cache key leaves that
    choice out while it does hold Inductor's config: a graph cached under one width and loaded under another
    compiles loops written for one lane count (16 floats for AVX-512) with another's vector types (8 for AVX2),
    which run past the ends of their buffers (a NaN loss or a crash). Stating the width the pick gives
    (``cpp.simdlen``, 0 for none) changes no kernel and puts it in the key."""
    try:
        from torch._inductor import config as inductor
        from torch._inductor.cpu_vec_isa import pick_vec_isa
    except ImportError:  # a torch without Inductor's CPU backend compiles nothing for the CPU
        return
    if inductor.cpp.simdlen is None:
        inductor.cpp.simdlen = pick_vec_isa().bit_width()


class StaticRunner:
    def __init__(self, schedule, model, counter: BitOpsCounter, opt: Optimizer, compile: str = "off"):
        self.schedule, self.model, self.counter = schedule, model, counter
        self._step = make_step(compiled(model, compile), opt, graphs=compile == "reduce-overhead")
        self.last_bitops, self.last_fw, self.last_bw = 0, 0.0, 0.0
        self.last_costs: dict[str, float] = {}
        self._last_iteration = 0
        self._trained: Precision | None = None  # the bits the last iteration trained at

    @property
    def events(self) -> list[dict]:
        return self.schedule.events

    def step(self, x: torch.Tensor, y: torch.Tensor, iteration: int) -> tuple[float, int]:
        prec = self.schedule.precision(iteration)
        loss, correct = self._step(x, y, prec)
        self.schedule.observe(iteration, loss)
        b = len(y) * distributed.current().size  # the global batch: every rank's slice is the same size
        self.last_bitops = b * self.counter.per_sample(prec)
        self.last_costs = self.counter.costs(prec, b)
        self.last_fw, self.last_bw = float(prec.act), float(prec.grad)
        self._last_iteration, self._trained = iteration, prec
        return loss, correct

    def eval_logits(self, x: torch.Tensor) -> torch.Tensor:
        # The bits the last iteration trained at, as the reference evaluates: a PFQ switch found at the end of
        # that iteration applies from the next one (methods.md §4.3), so asking the schedule now would give them.
        return self.model(x, self._trained or self.schedule.precision(self._last_iteration))

    def end_epoch(self) -> dict:
        return self.schedule.epoch_metrics()

    def summary(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        trained = self._trained and [self._trained.act, self._trained.weight, self._trained.grad]
        return {**self.schedule.state_dict(), "last_iteration": self._last_iteration, "trained": trained}

    def load_state_dict(self, state: dict) -> None:
        self.schedule.load_state_dict(state)
        self._last_iteration = int(state.get("last_iteration", 0))
        trained = state.get("trained")
        self._trained = Precision(**dict(zip(("act", "weight", "grad"), trained))) if trained else None
