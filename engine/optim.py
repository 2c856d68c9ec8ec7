"""The engine's two optimizers, SGD and Adam, in plain tensor operations.

They compute what ``torch.optim.SGD`` and ``torch.optim.Adam`` (L2 weight decay) compute on their per-tensor
path (the one torch takes on the CPU), operation for operation, so training is bit-identical to them, and their ``state_dict`` has the same
layout, so a checkpoint written by either loads in the other. They exist because every ``torch.optim``
optimizer imports ``torch._dynamo`` on first use (its methods are wrapped to keep ``torch.compile`` out), which
costs each training process, a trial actor included, seconds of CPU before its first step; the engine steps
its optimizer eagerly, outside any compiled region, and needs none of it.

The surface is what the engine uses: ``param_groups`` (the training loop sets each group's ``lr`` every
iteration, ``lr_at``), ``zero_grad``, ``step``, ``state_dict`` and ``load_state_dict``; ``for_config`` builds
the one a config asks for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.config.experiment import ExperimentConfig


class Optimizer:
    defaults: dict

    def __init__(self, params: Iterable[torch.Tensor], defaults: dict):
        params = list(params)
        if not params:
            raise ValueError("the optimizer got an empty parameter list")
        self.defaults = dict(defaults)
        self.param_groups = [{"params": params, **self.defaults}]
        self.state: dict[torch.Tensor, dict] = {}

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self._params():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    def state_dict(self) -> dict:
        """torch.optim's layout: parameters by index, in group order."""
        index = {id(p): i for i, p in enumerate(self._params())}
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[id(p)] for p in g["params"]]}
                  for g in self.param_groups]
        state = {index[id(p)]: dict(s) for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """A state written by this class or by the torch.optim optimizer of the same name. Floating state moves
        to its parameter's device and dtype (``step`` excepted), as torch.optim does."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(mine["params"]) for g, mine in zip(groups, self.param_groups, strict=True)):
            raise ValueError("the optimizer state does not match this model's parameters")
        params = self._params()
        self.state = {}
        for key, values in state_dict["state"].items():
            p = params[int(key)]
            self.state[p] = {name: _placed(v, p) if name != "step" else v for name, v in values.items()}
        for mine, saved in zip(self.param_groups, groups, strict=True):
            mine.update({k: v for k, v in saved.items() if k != "params"})


def _placed(value, p: torch.Tensor):
    if not isinstance(value, torch.Tensor):
        return value
    return value.to(device=p.device, dtype=p.dtype) if value.is_floating_point() else value.to(p.device)


class SGD(Optimizer):
    """``torch.optim.SGD`` (momentum, dampening, Nesterov, L2 weight decay)."""

    def __init__(self, params, lr: float, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov, "maximize": False,
                                  "foreach": None, "differentiable": False, "fused": None})

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if wd != 0:
                    grad = grad.add(p, alpha=wd)
                if momentum != 0:
                    state = self.state.setdefault(p, {})
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = grad.detach().clone()
                    else:
                        buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
                    grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
                p.add_(grad, alpha=-lr)


class Adam(Optimizer):
    """``torch.optim.Adam`` with L2 weight decay (not AdamW's decoupled one), no AMSGrad."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                                  "differentiable": False, "fused": None, "decoupled_weight_decay": False})

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state.setdefault(p, {})
                if not state:  # torch.optim's lazy state: the step count a float32 scalar on the CPU
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                grad, exp_avg, exp_avg_sq = p.grad, state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                if wd != 0:
                    grad = grad.add(p, alpha=wd)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step = state["step"].item()
                bias_correction1 = 1 - beta1**step
                bias_correction2_sqrt = (1 - beta2**step) ** 0.5
                denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
                p.addcdiv_(exp_avg, denom, value=-(lr / bias_correction1))


def lr_at(cfg: ExperimentConfig, iteration: int, total: int) -> float:
    """The learning rate of ``iteration`` of ``total``: warm-up, then constant, cosine to ``lr * lr_floor``, or
    piecewise (times ``gamma`` at each milestone, a fraction of the run)."""
    o = cfg.optim
    if iteration < o.warmup_iters:
        return o.warmup_lr
    if o.lr_schedule == "constant":
        return o.lr
    if o.lr_schedule == "cosine":  # from lr down to lr * lr_floor, as the reference's anneal_cosine
        low = o.lr * o.lr_floor
        return low + 0.5 * (o.lr - low) * (1.0 + math.cos(math.pi * iteration / total))
    drops = sum(1 for m in o.milestones if iteration >= round(m * total))
    return o.lr * (o.gamma ** drops)


def for_config(cfg: ExperimentConfig, model: torch.nn.Module) -> SGD | Adam:
    """The optimizer of ``cfg.optim``: SGD (momentum, weight decay, Nesterov) or Adam."""
    o = cfg.optim
    if o.optimizer == "adam":  # the Transformer's (methods.md §11); weight decay as L2, as SGD's
        return Adam(model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
    return SGD(model.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, nesterov=o.nesterov)
