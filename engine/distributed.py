"""Data-parallel training: what one run means on N workers (docs/methods.md §12).

A run on ``workers: N`` is N processes in one ``torch.distributed`` process group (gloo on CPU, NCCL on GPU),
started by whoever runs them (Ray Train's ``TorchTrainer``, or a test's own processes); the engine reads the
group, if any, through ``current()``. With no group, or a group of one, every method here does nothing, and the
run is exactly the one-process run.

What the engine keeps identical on every rank, and how:

* the data: every rank draws the same global batches (``batch_size`` per worker, ``N * batch_size`` a step)
  from the same seeded order, cut to a multiple of N samples, and trains on its own slice of each (``shard``);
* the parameters: the same seed builds the same model; after each backward the gradients are averaged over
  the ranks (``average_gradients``: one all-reduce, a gradient a rank did not produce counts as zero), so the
  identical optimizer steps keep the copies identical;
* what decides: the step's loss, number correct and samples are summed over the ranks (``sum``) before any
  schedule sees them, so PFQ's indicator, FracTrain's stages and a NaN check decide alike everywhere; DFQ's cp
  is averaged and the gate's choices and logits gathered (``gather``), so every rank's controller sets the same
  price from the same global batch;
* the running statistics (BatchNorm, the activation ranges, DFQ's per-option copies): each rank updates its
  own from its slice during the epoch, and they are averaged over the ranks at its end (``average_buffers``),
  before evaluation and any checkpoint.
"""

from __future__ import annotations

import contextlib

import torch


class World:
    """The ranks of one run: ``rank`` and ``size``, from ``torch.distributed`` when a group is initialised."""

    def __init__(self, group: bool = True) -> None:
        """``group``: read this process's torch.distributed group; False: the single process."""
        import torch.distributed as dist

        self.on = group and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.rank = dist.get_rank() if self.on else 0
        self.size = dist.get_world_size() if self.on else 1
        self._dist = dist

    def _device(self) -> torch.device:
        backend = self._dist.get_backend() if self.on else "gloo"
        return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks (float64)."""
        if not self.on:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self._device())
        self._dist.all_reduce(t)
        return t.tolist()

    def mean_(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` averaged over the ranks, in place (a float tensor on the group's device); returned."""
        if self.on:
            self._dist.all_reduce(t)
            t.div_(self.size)
        return t

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's ``t`` (the same shape on each) concatenated along the first dimension, in rank order."""
        if not self.on:
            return t
        dev = self._device()
        parts = [torch.empty_like(t, device=dev) for _ in range(self.size)]
        self._dist.all_gather(parts, t.to(dev))
        return torch.cat(parts).to(t.device)

    def shard(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's slice of a global batch: ``x``'s rows and their targets (a language model's ``y`` is the
        flattened (B * T) targets of B rows)."""
        if not self.on:
            return x, y
        rows = len(x)
        xs = x.tensor_split(self.size)[self.rank]
        ys = y.reshape(rows, -1).tensor_split(self.size)[self.rank]
        return xs, ys.reshape(-1)

    def average_gradients(self, params) -> None:
        """The gradients of ``params`` averaged over the ranks in one all-reduce; a missing one (a block this
        rank's inputs all skipped) counts as zero and is set, so every rank steps the same parameters."""
        if not self.on:
            return
        params = [p for p in params if p.requires_grad]
        if not params:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        self.mean_(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n

    def average_buffers(self, module: torch.nn.Module) -> None:
        """``module``'s floating-point buffers (running statistics and ranges) averaged over the ranks."""
        if not self.on:
            return
        for buf in module.buffers():
            if buf.is_floating_point():
                self.mean_(buf.data)


_current = World(group=False)


def current() -> World:
    """The world of the run in progress (``use``), else the single process."""
    return _current


@contextlib.contextmanager
def use(world: World):
    """Make ``world`` the current one for the duration of a run."""
    global _current
    before, _current = _current, world
    try:
        yield world
    finally:
        _current = before
