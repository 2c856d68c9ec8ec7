"""DFQ and FracTrain training steps (algorithms.md 3.4-3.5 and 4), with exact per-sample BitOPs.

``BlockCosts`` prices every (block, option) pair for one sample from the model's MACs table: the block's
layers at the option's (a, w, g) (depthwise convs at their fixed precision), a skipped block at 0 plus its
fp32 projection when it has one; the layers outside the gated blocks (stem, head, FC: fp32 in DFQ) cost the
same for every sample; the gate's own cost is kept apart (``gate``).

``GatedRunner.step`` is one iteration: forward through the gated model, ``loss = CE + s * beta * mean_i c_i``
with the sign from the current batch's gated cp against the target, SGD on backbone and gate together, and
the exact BitOPs of the choices made. For FracTrain the target is ``cp0 + stage * cp_step`` and the stage is
PFQ's loss indicator fed with the CE (default) or the total loss (the reference).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.cost import BitOpsCounter, layer_cost
from engine.errors import TrainingDiverged
from engine.gate import cost_per_sample, gated_cp, option_kappa, sign_dfq, sign_fractrain
from engine.indicator import LossIndicator
from engine.models.gated import GatedModel
from engine.precision import FP32, Precision


class BlockCosts:
    def __init__(self, counter: BitOpsCounter, options: list[Precision], num_blocks: int, gate_macs: int):
        lm = counter.layer_map
        self.table = [[0] * len(options) for _ in range(num_blocks)]  # (L, K) BitOPs per sample
        self.block_macs = [0] * num_blocks
        self.fixed = 0
        for layer in counter.table:
            if layer.block is None:
                self.fixed += layer_cost(layer.macs, lm.resolve(layer.role, FP32)).total
                continue
            self.block_macs[layer.block] += layer.macs
            for k, opt in enumerate(options):
                if opt.skip:  # the skip path runs the block's projection (if any) in fp32
                    cost = layer_cost(layer.macs, FP32).total if layer.name.endswith(".proj") else 0
                else:
                    cost = layer_cost(layer.macs, lm.resolve(layer.role, opt)).total
                self.table[layer.block][k] += cost
        self.gate = 3 * gate_macs * 32 * 32
        self.tensor = torch.tensor(self.table, dtype=torch.float64)

    def batch_bitops(self, choices: torch.Tensor) -> int:
        """Exact BitOPs of one iteration: fixed layers for every sample + each sample's chosen options."""
        b, num_blocks = choices.shape
        total = b * self.fixed
        for blk in range(num_blocks):
            counts = torch.bincount(choices[:, blk].cpu(), minlength=len(self.table[blk])).tolist()
            total += sum(c * cost for c, cost in zip(counts, self.table[blk]))
        return total


class GatedRunner:
    """One training iteration of DFQ / FracTrain, and their per-epoch statistics."""

    def __init__(self, sched, model: GatedModel, counter: BitOpsCounter, opt: torch.optim.Optimizer, ctx,
                 model_name: str):
        self.sched, self.model, self.counter, self.opt = sched, model, counter, opt
        self.options = model.options
        self.option_names = sched.option_names(model_name)
        self.costs = BlockCosts(counter, self.options, len(model.blocks), model.gate_macs())
        self.kappa = option_kappa(self.options, sched.weight_bits)
        macs = torch.tensor(self.costs.block_macs, dtype=torch.float32)
        self.omega = macs / macs.mean() if sched.omega_kind(model_name) == "macs" else torch.ones(len(macs))
        self.fractrain = sched.kind == "fractrain"
        self.events: list[dict] = []
        self.gate_bitops = 0  # the gate's own training cost (fp32), kept apart from the backbone's
        self.indicator = None
        if self.fractrain:
            self.indicator = LossIndicator(sched.epsilon, sched.alpha, sched.num_turning_points, sched.window,
                                           sched.scale_windows, sched.decay_after)
            unit = ctx.iterations_per_epoch if sched.eval_unit == "epochs" else 1
            self.window_iters = sched.eval_every * unit
            self.force_at = (None if sched.force_final_at is None
                             else math.ceil(sched.force_final_at * ctx.total_iterations))
            self.loss_sum, self.loss_count = 0.0, 0
            self.stage_cp: dict[int, list[float]] = {}
        self.reset_epoch()

    # -- targets -------------------------------------------------------------------------------------
    @property
    def stage(self) -> int:
        return self.indicator.turning_points if self.indicator else 0

    def target(self) -> float:
        return self.sched.targets()[self.stage] if self.fractrain else self.sched.target_cp

    def sign(self, cp: float) -> float:
        if self.fractrain:
            return sign_fractrain(cp, self.target(), self.sched.band)
        return sign_dfq(cp, self.target(), self.sched.relax)

    # -- one iteration --------------------------------------------------------------------------------
    def step(self, x: torch.Tensor, y: torch.Tensor, iteration: int) -> tuple[float, int]:
        if self.fractrain and self.force_at is not None and iteration >= self.force_at and not self.indicator.done:
            self.indicator.force()
            self.events.append({"iteration": iteration, "stage": self.stage, "target_cp": self.target(),
                                "reason": "forced"})
        logits, trace = self.model(x)
        ce = F.cross_entropy(logits, y)
        cp = gated_cp(trace.choices, self.kappa, self.omega)
        s = self.sign(cp)
        cost = cost_per_sample(trace, self.kappa, self.omega).mean()
        loss = ce + s * self.sched.beta * cost
        value = ce.item()
        if not math.isfinite(value):
            raise TrainingDiverged(f"training loss is {value}")
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self._account(trace.choices, cp, s)
        if self.fractrain:
            self._observe(iteration, value if self.sched.loss == "ce" else float(loss.item()), cp)
        return value, int((logits.argmax(1) == y).sum())

    def eval_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)[0]

    def _account(self, choices: torch.Tensor, cp: float, s: float) -> None:
        b = choices.shape[0]
        self.last_bitops = self.costs.batch_bitops(choices)
        self.gate_bitops += b * self.costs.gate
        self.ep_counts += torch.nn.functional.one_hot(choices.cpu(), len(self.options)).sum(0).to(torch.float64)
        self.ep_cp_sum += cp
        self.ep_sign_up += s > 0
        self.ep_iters += 1
        fw = torch.tensor([o.act if not o.skip else 0 for o in self.options], dtype=torch.float64)
        bw = torch.tensor([o.grad if not o.skip else 0 for o in self.options], dtype=torch.float64)
        picked = choices.cpu()
        self.last_fw = float(fw[picked].mean())
        self.last_bw = float(bw[picked].mean())
        self.last_batch = b

    def _observe(self, iteration: int, loss: float, cp: float) -> None:
        self.stage_cp.setdefault(self.stage, []).append(cp)
        self.loss_sum += loss
        self.loss_count += 1
        if (iteration + 1) % self.window_iters:
            return
        window_loss = self.loss_sum / self.loss_count
        self.loss_sum, self.loss_count = 0.0, 0
        if self.indicator.update(window_loss):
            self.events.append({"iteration": iteration + 1, "stage": self.stage, "target_cp": self.target(),
                                "reason": "turning point", "epsilon": self.indicator.epsilon})

    # -- per-epoch statistics -------------------------------------------------------------------------
    def reset_epoch(self) -> None:
        self.ep_counts = torch.zeros(len(self.model.blocks), len(self.options), dtype=torch.float64)
        self.ep_cp_sum, self.ep_sign_up, self.ep_iters = 0.0, 0, 0

    def bit_allocation(self) -> dict:
        """Per block: the fraction of inputs whose most probable option was each option (supplement Fig. 2)."""
        frac = self.ep_counts / self.ep_counts.sum(1, keepdim=True).clamp_min(1)
        fw = torch.tensor([o.act if not o.skip else 0 for o in self.options], dtype=torch.float64)
        bw = torch.tensor([o.grad if not o.skip else 0 for o in self.options], dtype=torch.float64)
        return {"options": self.option_names, "fractions": [[round(v, 5) for v in row] for row in frac.tolist()],
                "mean_fw_bits": (frac @ fw).tolist(), "mean_bw_bits": (frac @ bw).tolist()}

    def end_epoch(self) -> dict:
        """The epoch's gate statistics as metrics; starts the next epoch's counts."""
        alloc = self.bit_allocation()
        out = {"target_cp": self.target(), "cp_gated": self.ep_cp_sum / max(self.ep_iters, 1),
               "cost_sign_up": self.ep_sign_up / max(self.ep_iters, 1), "bit_allocation": alloc}
        for blk, (f, b) in enumerate(zip(alloc["mean_fw_bits"], alloc["mean_bw_bits"])):
            out[f"alloc_fw_b{blk:02d}"] = f
            out[f"alloc_bw_b{blk:02d}"] = b
            out[f"alloc_skip_b{blk:02d}"] = sum(fr for fr, o in zip(alloc["fractions"][blk], self.options) if o.skip)
        if self.fractrain:
            out["stage"] = float(self.stage)
        self.reset_epoch()
        return out

    def summary(self) -> dict:
        out = {"gate_bitops": float(self.gate_bitops)}
        if self.fractrain:
            out.update(cp_per_stage={str(k): sum(v) / len(v) for k, v in sorted(self.stage_cp.items())},
                       targets=self.sched.targets())
        return out

    def state_dict(self) -> dict:
        st = {"events": list(self.events), "gate_bitops": self.gate_bitops}
        if self.fractrain:
            st.update(indicator=self.indicator.state_dict(), loss_sum=self.loss_sum, loss_count=self.loss_count,
                      stage_cp={str(k): list(v) for k, v in self.stage_cp.items()})
        return st

    def load_state_dict(self, state: dict) -> None:
        self.events = list(state.get("events", []))
        self.gate_bitops = int(state.get("gate_bitops", 0))
        if self.fractrain:
            self.indicator.load_state_dict(state["indicator"])
            self.loss_sum, self.loss_count = float(state["loss_sum"]), int(state["loss_count"])
            self.stage_cp = {int(k): list(v) for k, v in state["stage_cp"].items()}
