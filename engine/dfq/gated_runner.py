"""DFQ and FracTrain training steps (docs/methods.md §6-7), with exact per-sample BitOPs.

``BlockCosts`` prices every (block, option) pair for one sample from the model's MACs table: the block's
layers at the option's (a, w, g) (depthwise convs at their fixed precision), a skipped block at 0 plus its
fp32 projection when it has one; the layers outside the gated blocks (stem, head, FC: fp32 in DFQ) cost the
same for every sample; the gate's own cost is kept apart (``gate``). ``batch_costs`` prices the same choices
under every cost model of the counter (a model's per-iteration part, the weights, once per block and option
chosen by at least one sample of the batch: routed execution reads each option's weights once).

A language model's "sample" of the counter is a token while the gate decides per sequence (methods.md
§11.1): one row of choices stands for ``tokens`` samples (the sequence length; 1 for images), every token of
a sequence costing its sequence's options; the gate runs once per sequence.

``GatedRunner.step`` is one iteration: forward through the gated model (its decisions priced by the
controller, §6.5), ``loss = CE + weight * mean_i c_i`` with the weight from the controller, SGD on backbone
and gate together, and the exact BitOPs of the choices made. The target and the controller are in the cost
basis the schedule names (engine.dfq.basis: the gated blocks, or the whole model); every epoch logs the cp on
both (``cp_gated``, ``cp_model``). The cp target comes from a ``FixedTarget`` (DFQ)
or a ``StagedTarget`` (FracTrain: ``cp0 + stage * cp_step``, the stage from PFQ's indicator staging, §7).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine import distributed
from engine.cost.bitops import BitOpsCounter, layer_cost
from engine.dfq.basis import CpBasis, build_bases
from engine.dfq.controller import PRICE_LIMIT, build_controller
from engine.dfq.gate import ada_beta_scale, cost_per_sample
from engine.dfq.gated import GatedModel
from engine.numerics.precision import FP32, Precision
from engine.optim import Optimizer
from engine.run_length import RunLength
from engine.schedules.indicator import Staging
from engine.schedules.static_runner import sgd_step


class BlockCosts:
    def __init__(self, counter: BitOpsCounter, options: list[Precision], num_blocks: int, gate_macs: int):
        lm = counter.layer_map
        self.table = [[0] * len(options) for _ in range(num_blocks)]  # (L, K) BitOPs per sample
        # The same as the papers' cp prices it (methods.md §6.4): a layer that follows the option at kappa_k, whatever
        # its kind of layer; one at a fixed precision (MobileNetV2's depthwise convs) at that precision.
        self.papers = [[0] * len(options) for _ in range(num_blocks)]
        self.block_macs = [0] * num_blocks
        self.fixed = 0
        for layer in counter.table:
            if layer.block is None:
                self.fixed += layer_cost(layer.macs, lm.resolve(layer.role, FP32)).total
                continue
            self.block_macs[layer.block] += layer.macs
            pinned = layer.role == "depthwise" and lm.depthwise is not None
            for k, opt in enumerate(options):
                if opt.skip:  # the skip path runs the block's projection (if any) in fp32
                    cost = papers = layer_cost(layer.macs, FP32).total if layer.name.endswith(".proj") else 0
                else:
                    cost = layer_cost(layer.macs, lm.resolve(layer.role, opt)).total
                    papers = cost if pinned else layer.macs * opt.bitops_per_mac()
                self.table[layer.block][k] += cost
                self.papers[layer.block][k] += papers
        self.gate = 3 * gate_macs * 32 * 32
        self._model_tables(counter, options, num_blocks)

    def _model_tables(self, counter: BitOpsCounter, options: list[Precision], num_blocks: int) -> None:
        """Per model: (per sample, per iteration) of the fixed layers and of every (block, option)."""
        lm = counter.layer_map
        self.models = [m.name for m in counter.models]
        self.m_fixed = {n: [0, 0] for n in self.models}
        self.m_table = {n: [[[0, 0] for _ in options] for _ in range(num_blocks)] for n in self.models}
        for model in counter.models:
            for layer in counter.table:
                if layer.block is None:
                    s, i = model.layer_cost(layer, lm.resolve(layer.role, FP32))
                    self.m_fixed[model.name][0] += s
                    self.m_fixed[model.name][1] += i
                    continue
                for k, opt in enumerate(options):
                    if opt.skip:
                        s, i = model.layer_cost(layer, FP32) if layer.name.endswith(".proj") else (0, 0)
                    else:
                        s, i = model.layer_cost(layer, lm.resolve(layer.role, opt))
                    cell = self.m_table[model.name][layer.block][k]
                    cell[0] += s
                    cell[1] += i

    def batch_costs(self, choices: torch.Tensor, tokens: int = 1) -> dict[str, float]:
        """One iteration's cost under every model (``bitops`` equals ``batch_bitops``); each row of ``choices``
        stands for ``tokens`` samples (a language model's sequence)."""
        b, num_blocks = choices.shape
        counts = [torch.bincount(choices[:, blk].cpu(), minlength=len(self.table[blk])).tolist()
                  for blk in range(num_blocks)]
        out = {}
        for name in self.models:
            fs, fi = self.m_fixed[name]
            total = b * tokens * fs + fi
            for blk in range(num_blocks):
                for c, (s, i) in zip(counts[blk], self.m_table[name][blk]):
                    if c:
                        total += c * tokens * s + i
            out[name] = total
        return out

    def batch_bitops(self, choices: torch.Tensor, tokens: int = 1) -> int:
        """Exact BitOPs of one iteration: fixed layers for every sample + each sample's chosen options (each row
        of ``choices`` standing for ``tokens`` samples: a language model's sequence)."""
        b, num_blocks = choices.shape
        total = b * self.fixed
        for blk in range(num_blocks):
            counts = torch.bincount(choices[:, blk].cpu(), minlength=len(self.table[blk])).tolist()
            total += sum(c * cost for c, cost in zip(counts, self.table[blk]))
        return total * tokens


class FixedTarget:
    """DFQ: one cp target for the whole run."""

    def __init__(self, target: float):
        self.value = target
        self.events: list[dict] = []

    def target(self) -> float:
        return self.value

    def before(self, iteration: int) -> None:
        pass

    def observe(self, iteration: int, ce: float, total: float, cp: float) -> None:
        pass

    def epoch_metrics(self) -> dict:
        return {}

    def summary(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class StagedTarget:
    """FracTrain: ``cp_i = cp0 + i * cp_step`` at indicator stage i (supplement eq. 1 for cp0 from cp_total).

    The indicator reads the CE (``loss: ce``) or the reference's total loss, CE + cost term (``loss: total``).
    The realised gated cp of every stage is recorded (``cp_per_stage``): eq. 1 assumes equal stage lengths,
    which the indicator does not promise."""

    def __init__(self, sched, run: RunLength):
        self.targets, self.loss = sched.targets(), sched.loss
        self.staging = Staging(sched, sched.num_turning_points, run, lambda st: {"target_cp": self.targets[st]})
        self.stage_cp: dict[int, list[float]] = {}

    @property
    def events(self) -> list[dict]:
        return self.staging.events

    def target(self) -> float:
        return self.targets[self.staging.stage]

    def before(self, iteration: int) -> None:
        self.staging.before(iteration)

    def observe(self, iteration: int, ce: float, total: float, cp: float) -> None:
        self.stage_cp.setdefault(self.staging.stage, []).append(cp)
        self.staging.observe(iteration, ce if self.loss == "ce" else total)

    def epoch_metrics(self) -> dict:
        return {"stage": float(self.staging.stage)}

    def summary(self) -> dict:
        return {"cp_per_stage": {str(k): sum(v) / len(v) for k, v in sorted(self.stage_cp.items())},
                "targets": list(self.targets)}

    def state_dict(self) -> dict:
        return {"staging": self.staging.state_dict(), "stage_cp": {str(k): list(v) for k, v in self.stage_cp.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.staging.load_state_dict(state["staging"])
        self.stage_cp = {int(k): list(v) for k, v in state["stage_cp"].items()}


def cost_bases(sched, model: GatedModel, counter: BitOpsCounter, model_name: str,
               tokens: int = 1) -> tuple[BlockCosts, dict[str, CpBasis]]:
    """The prices of a gated model's choices and the cp bases built on them (both, by name). ``tokens``: the
    counter's samples per decision (a language model's sequence), which share one gate run."""
    costs = BlockCosts(counter, model.options, len(model.blocks), model.gate_macs())
    macs = torch.tensor(costs.block_macs, dtype=torch.float64)
    omega = macs / macs.mean() if sched.omega_kind(model_name) == "macs" else torch.ones(len(macs),
                                                                                         dtype=torch.float64)
    return costs, build_bases(model.options, costs.table, costs.papers, costs.block_macs, costs.fixed,
                              costs.gate / tokens, counter.fp32_per_sample(), omega, model.gate.allowed.cpu())


class GatedRunner:
    """One training iteration of DFQ / FracTrain, and their per-epoch statistics."""

    def __init__(self, sched, model: GatedModel, counter: BitOpsCounter, opt: Optimizer,
                 run: RunLength, model_name: str, tokens: int = 1):
        self.sched, self.model, self.counter, self.opt = sched, model, counter, opt
        self.options = model.options
        self.option_names = sched.option_names(model_name)
        self.costs, self.bases = cost_bases(sched, model, counter, model_name, tokens)
        self.basis = self.bases[sched.cost_basis]  # the one the target names and the controller steers
        self.kappa, self.omega = self.basis.kappa, self.basis.omega
        # a host copy for the price search, in the model buffer's float32, which the decisions use
        self.option_cost = self.basis.option_cost()
        model.set_option_cost(self.option_cost)
        self.goal = StagedTarget(sched, run) if sched.kind == "fractrain" else FixedTarget(sched.target_cp)
        self.controller = build_controller(sched)
        self.fw = torch.tensor([0 if o.skip else o.act for o in self.options], dtype=torch.float64)
        self.bw = torch.tensor([0 if o.skip else o.grad for o in self.options], dtype=torch.float64)
        self.gate_bitops = 0  # the gate's own training cost (fp32), kept apart from the backbone's
        # routed execution after a masked warm-up of routed_warmup of the run (methods.md §6.3)
        self.warmup_iterations = (int(sched.routed_warmup * run.total_iterations)
                                  if sched.execution == "routed" else 0)
        self.reset_epoch()

    @property
    def events(self) -> list[dict]:
        return self.goal.events

    # -- one iteration --------------------------------------------------------------------------------
    def step(self, x: torch.Tensor, y: torch.Tensor, iteration: int) -> tuple[float, int]:
        self.goal.before(iteration)
        target = self.goal.target()
        if self.warmup_iterations:
            self.model.execution = "masked" if iteration < self.warmup_iterations else "routed"
        self.model.set_price(self.controller.price)
        logits, trace = self.model(x)
        ce = F.cross_entropy(logits, y)
        cp_dev = self.basis.cp_tensor(trace.choices)
        world = distributed.current()
        if world.on:  # the global batch's cp: every rank weighs its cost term by the same sign
            cp_dev = world.mean_(cp_dev.detach().double().clone())
        weight = self.controller.loss_weight(cp_dev, target)
        use_cost = isinstance(weight, torch.Tensor) or weight
        if use_cost:
            cost = cost_per_sample(trace, self.kappa, self.omega).mean()
            if self.sched.ada_beta:
                cost = cost * ada_beta_scale(cost, self.controller.beta, ce)
            loss = ce + weight * cost
        else:
            loss = ce
        ce_v, total, cp, correct, choices, raw = self._read(ce, loss, cp_dev, logits, y, trace)
        if world.on:  # the global batch: its losses, its choices and the gate's logits, the same on every rank
            n = len(y)
            ce_s, total_s, correct, n = world.sum([ce_v * n, total * n, correct, n])
            ce_v, total, correct = ce_s / n, total_s / n, int(correct)
            choices = world.gather(choices)
            raw = world.gather(raw) if raw is not None else None
        self.controller.weight(cp, target)  # records the sign the device computed
        value = sgd_step(self.opt, loss, ce_v)
        self.controller.update(cp, target, lambda: self.basis.price_for_target(
            raw, self.option_cost, target, PRICE_LIMIT))
        self.last_cp = cp
        # samples of the counter per decision: 1 for an image, the T tokens of a language model's sequence
        self._account(choices, cp, target, len(y) // len(choices))
        self.goal.observe(iteration, value, total, cp)
        return value, correct

    def _read(self, ce, loss, cp, logits, y, trace) -> tuple[float, float, float, int, torch.Tensor, torch.Tensor]:
        """Everything the host needs of a step in one transfer (each read makes the host wait for a GPU): the
        CE, the total loss, the gated cp, the number correct, the choices and the gate's raw logits (the dual
        controller's price search runs on the host copy). Float64 holds each of them exactly."""
        b, blocks = trace.choices.shape
        parts = [torch.stack([ce.detach().double(), loss.detach().double(), cp.double(),
                              (logits.argmax(1) == y).sum().double()]), trace.choices.reshape(-1).double()]
        if self.controller.kind == "dual" and trace.logits is not None:
            parts.append(trace.logits.reshape(-1).double())
        host = torch.cat(parts).cpu()
        ce_v, total, cp_v, correct = host[:4].tolist()
        choices = host[4:4 + b * blocks].long().view(b, blocks)
        raw = host[4 + b * blocks:].view(b, blocks, -1) if len(parts) == 3 else None
        return ce_v, total, cp_v, int(correct), choices, raw

    def eval_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)[0]

    def _account(self, choices: torch.Tensor, cp: float, target: float, tokens: int = 1) -> None:
        b = choices.shape[0]
        picked = choices  # on the host already
        self.last_bitops = self.costs.batch_bitops(picked, tokens)
        self.last_costs = self.costs.batch_costs(picked, tokens)
        self.gate_bitops += b * self.costs.gate  # once per decision row: per sequence for a language model
        self.ep_counts += F.one_hot(picked, len(self.options)).sum(0).to(torch.float64)
        for name, basis in self.bases.items():  # both bases' cp (the steered one is ``cp``, read from the step)
            self.ep_cp_sum[name] += cp if basis is self.basis else basis.cp(picked)
        self.ep_err_sum += abs(cp / target - 1.0)
        self.ep_sign_up += self.controller.last_sign > 0
        self.ep_iters += 1
        self.last_fw, self.last_bw = float(self.fw[picked].mean()), float(self.bw[picked].mean())

    # -- per-epoch statistics -------------------------------------------------------------------------
    def reset_epoch(self) -> None:
        self.ep_counts = torch.zeros(len(self.model.blocks), len(self.options), dtype=torch.float64)
        self.ep_cp_sum = dict.fromkeys(self.bases, 0.0)
        self.ep_err_sum, self.ep_sign_up, self.ep_iters = 0.0, 0, 0

    def bit_allocation(self) -> dict:
        """Per block: the fraction of inputs that took each option, with the mean FW/BW bits (supplement Fig. 2)."""
        frac = self.ep_counts / self.ep_counts.sum(1, keepdim=True).clamp_min(1)
        return {"options": self.option_names, "fractions": [[round(v, 5) for v in row] for row in frac.tolist()],
                "mean_fw_bits": (frac @ self.fw).tolist(), "mean_bw_bits": (frac @ self.bw).tolist()}

    def end_epoch(self) -> dict:
        """The epoch's gate statistics as metrics; starts the next epoch's counts."""
        alloc = self.bit_allocation()
        n = max(self.ep_iters, 1)
        out = {"target_cp": self.goal.target(), "cp_gated": self.ep_cp_sum["gated"] / n,
               "cp_model": self.ep_cp_sum["model"] / n, "cp_batch_error": self.ep_err_sum / n,
               "cost_sign_up": self.ep_sign_up / n, "gate_price": self.controller.price,
               "gate_bitops": float(self.gate_bitops), "bit_allocation": alloc, **self.goal.epoch_metrics()}
        skip = torch.tensor([o.skip for o in self.options], dtype=torch.float64)
        frac = torch.tensor(alloc["fractions"], dtype=torch.float64)
        for blk, (f, b, s) in enumerate(zip(alloc["mean_fw_bits"], alloc["mean_bw_bits"], (frac @ skip).tolist())):
            out[f"alloc_fw_b{blk:02d}"], out[f"alloc_bw_b{blk:02d}"], out[f"alloc_skip_b{blk:02d}"] = f, b, s
        self.reset_epoch()
        return out

    def summary(self) -> dict:
        return {"gate_bitops": float(self.gate_bitops), "controller": self.controller.kind, **self.goal.summary()}

    def state_dict(self) -> dict:
        return {"gate_bitops": self.gate_bitops, "controller": self.controller.state_dict(),
                "goal": self.goal.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.gate_bitops = int(state["gate_bitops"])
        self.controller.load_state_dict(state["controller"])
        self.goal.load_state_dict(state["goal"])
