"""DFQ's gated networks: any fractune backbone with residual ``blocks`` plus a recurrent gate that picks each
block's precision option per input (docs/methods.md §6.1, §6.3): an image of a CNN, a sequence of a Transformer
language model (methods.md §11.1). Block inputs may have any rank, rows (dim 0) being the inputs: ``(B, C, H,
W)`` images, ``(B, T, d)`` sequences; the gate reads the backbone's ``gate_summary`` of each block input (the
global average pool of an image; a sequence's first position, which keeps a language model strictly causal).

Three executions give the same forward values for the same choices in eval mode (``conv``, methods.md §6.3:
FracTrain's ImageNet design, one pass of each block as routed without a skip option, every quantized layer of
the block mixing its input over the options for the gate's gradient, ``ConvMix``; described with ``_conv``):

* ``masked`` (the reference): every option runs on the whole batch, ``h_l = sum_k m_lk * y_lk``. The gate's
  CE gradient is ``<dL/dh_l, y_lk>`` for every option k, which is why every candidate is materialised.
* ``routed``: each sample runs only at its chosen option, in one pass of the block over every computed sample
  (``MixedPrecision``: each option's rows quantized at its bits, one batch range for the activations), so BN
  and the activation ranges see the whole computed batch as in masked execution; skipped samples take the
  skip path (the identity, or the block's 1x1 projection in fp32). Gradient estimator (``routed_estimator``):

  - ``skip``: every unchosen non-skip option is taken to produce the chosen output,
    ``h = m_nonskip * y_c + m_skip * y_skip``, so the gate's CE gradient compares computing the block with
    skipping it (a sample that skipped gets none); no compute beyond the chosen options.
  - ``sampled`` (default): for every sample one alternative non-skip option ``a`` is drawn uniformly from those it did
    not choose and run forward only (no gradient, no change to running statistics). With ``Y_comp`` = the
    chosen output (or ``y_a`` for a sample that skipped), the block's output is
    ``h = (m_nonskip - m_a) * Y_comp + m_a * sg(y_a) + m_skip * y_skip`` with ``m_a``'s gradient weighted by
    the number of unchosen options: one-hot in value, an unbiased estimate of masked's CE gradient on the gate
    for a computed sample (a skipped one: ``y_a`` stands in for every non-skip option), at one forward pass of
    every block more.
  - ``grouped``: ``sampled`` over forward groups (options with the same FW bits compute the same forward
    values): the chosen one's group gets the chosen output exactly, the alternative is one of the other groups.
  - ``exact``: every other forward group runs forward-only for every sample: masked's gate gradient, at one
    forward pass of every block per other group.

  The cost term's gradient needs no outputs and is the same in every execution.

  ``routed_statistics`` says which samples a routed block's pass runs over in training: ``computed`` (only the
  samples that compute the block) or ``batch`` (the samples that skip it too, each at its drawn alternative,
  their outputs discarded but kept as the estimator's alternative), so the BN batch statistics and the
  activation range cover the whole batch as in masked execution (methods.md §6.3).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.dfq.gate import GateTrace, RecurrentGate, floor_skips, straight_through
from engine.dfq.routing import Permute, RoutedOutput, inverse
from engine.dfq.vocabulary import EXECUTIONS, OPTION_STATES, ROUTED_ESTIMATORS, ROUTED_STATISTICS
from engine.models.base import QModel
from engine.numerics.autograd import weights_fixed
from engine.numerics.layers import frozen_state
from engine.numerics.precision import FP32, ConvMix, MixedPrecision, Precision


def rows(m: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-input (B,) weight shaped to broadcast over ``like``'s rows, whatever its rank."""
    return m.view(-1, *[1] * (like.dim() - 1))


class GatedModel(nn.Module):
    def __init__(self, backbone: QModel, options: list[Precision], execution: str = "masked",
                 gate_dim: int = 32, embed_dim: int = 16, hidden_dim: int = 16, routed_estimator: str = "sampled",
                 sample_fraction: float = 1.0, option_state: str = "shared", routed_statistics: str = "computed",
                 block_floor: float = 0.0):
        super().__init__()
        # a config is validated at the boundary (GatedSettings, with its bounds and cross-field rules); a model
        # built directly is held to the same choices, so that a misspelt one fails here instead of running as
        # another setting
        for name, value, choices in (("execution", execution, EXECUTIONS),
                                     ("routed_estimator", routed_estimator, ROUTED_ESTIMATORS),
                                     ("routed_statistics", routed_statistics, ROUTED_STATISTICS),
                                     ("option_state", option_state, OPTION_STATES)):
            if value not in choices:
                raise ValueError(f"{name} {value!r} is not one of {', '.join(choices)}")
        self.block_floor = block_floor
        self.sample_fraction = sample_fraction
        self.backbone = backbone
        self.options = list(options)
        self.execution = execution
        self.routed_estimator = routed_estimator
        self.routed_statistics = routed_statistics
        allowed = torch.tensor([[not (o.skip and not getattr(b, "can_skip", False)) for o in self.options]
                                for b in backbone.blocks])
        if not allowed.any(dim=1).all():
            raise ValueError("every block needs at least one option it can take")
        self._allowed: list[list[bool]] = allowed.tolist()  # read on the host: no wait for a GPU
        self.skip_index = next((k for k, o in enumerate(self.options) if o.skip), None)
        self._computed_k = next((k for k, o in enumerate(self.options) if not o.skip), 0)
        self.weight_bits = next((o.weight for o in self.options if not o.skip), 32)
        # forward groups: non-skip options with the same FW bits compute the same forward values (they differ
        # only in BW), so the routed estimators treat them as one (methods.md §6.3). same_fw (K, K);
        # fw_first (K,): the first option of each group, which runs for it
        fw = [None if o.skip else o.act for o in self.options]
        self.register_buffer("same_fw", torch.tensor([[a is not None and a == b for b in fw] for a in fw]),
                             persistent=False)
        self._fw_first = [a is not None and fw.index(a) == k for k, a in enumerate(fw)]
        self.register_buffer("fw_first", torch.tensor(self._fw_first), persistent=False)
        if execution == "conv" and self.skip_index is not None:
            raise ValueError("execution conv runs every block for every sample: no skip option")
        self._acts = tuple(o.act for o in self.options)
        self.gate = RecurrentGate([b.in_channels for b in backbone.blocks], len(self.options), allowed,
                                  gate_dim, embed_dim, hidden_dim, embed_layers=1 if execution == "conv" else 2)
        # the dual controller's price on the options' normalised costs (engine.dfq.controller): (L, K) and a scalar;
        # saved with the model, so evaluation and a resumed run decide as training did
        self.register_buffer("option_cost", torch.zeros(len(backbone.blocks), len(self.options)))
        self.register_buffer("price", torch.zeros(()))
        self._price_host: float | None = 0.0
        self.register_load_state_dict_post_hook(lambda module, _keys: setattr(module, "_price_host", None))
        # running statistics kept apart (methods.md §6.3): per_option (masked only) = every option keeps its own
        # copy of each block's running statistics (BN means and variances, the quantizers' activation ranges),
        # as switchable BN does; skip_apart = the skip path (a downsampling block's fp32 projection, whose BN
        # the reference shares with the quantized projection of the computed options) keeps its own copy and
        # every computed option shares the other. The copies are buffers, so checkpoints and evaluation carry
        # them; ``_state_key[k]`` names option k's copy (None: the block's own buffers, shared)
        self.option_state = option_state
        self._state_key = [None if option_state == "shared" else
                           str(k) if option_state == "per_option" or o.skip else "computed"
                           for k, o in enumerate(self.options)]
        self._state_slots: list[list[tuple[nn.Module, str]]] = []  # per block: (module, buffer name) of each statistic
        for i, block in enumerate(backbone.blocks):
            slots = [(block.get_submodule(n.rpartition(".")[0]), n.rpartition(".")[2])
                     for n, b in block.named_buffers() if b.is_floating_point()]
            keys = {self._state_key[k] for k in range(len(self.options)) if bool(self.gate.allowed[i, k])} - {None}
            if option_state == "skip_apart":  # what the skip path shares with the computed options, if it can skip
                skip_ids = {id(m) for m in getattr(block, "skip_modules", list)()}
                slots = [(m, n) for m, n in slots if id(m) in skip_ids] if len(keys) == 2 else []
            slots = slots if keys else []
            self._state_slots.append(slots)
            for key in sorted(keys):
                for j, (module, name) in enumerate(slots):
                    self.register_buffer(f"option_state_{i}_{key}_{j}", module._buffers[name].detach().clone())

    def set_option_cost(self, cost: torch.Tensor) -> None:
        self.option_cost.copy_(cost.to(self.option_cost))

    def set_price(self, price: float) -> None:
        self.price.fill_(price)
        self._price_host = float(price)

    def _priced(self) -> bool:
        """Whether the price is non-zero, from its host copy (a read of the buffer makes the host wait for a GPU);
        after a state dict was loaded, the buffer is read once."""
        if self._price_host is None:
            self._price_host = float(self.price)
        return self._price_host != 0

    @property
    def blocks(self) -> nn.ModuleList:
        return self.backbone.blocks

    # -- per-option running statistics ------------------------------------------------------------------------
    def _use_state(self, i: int, k: int) -> None:
        """Point block ``i``'s statistics at option ``k``'s copy, if it has one (swapped, not copied: autograd
        keeps the BN statistics of every option's pass for its backward, so none may change in place
        afterwards). Every pass of a block calls it first, so whatever a previous pass left is never used."""
        for j, (module, name) in enumerate(self._state_slots[i]):
            module._buffers[name] = getattr(self, f"option_state_{i}_{self._state_key[k]}_{j}")

    @torch.no_grad()
    def reset_option_state(self) -> None:
        """Every option's copy set to its block's current statistics (after pretrained weights are loaded)."""
        for i, slots in enumerate(self._state_slots):
            for key in set(self._state_key) - {None}:
                for j, (module, name) in enumerate(slots):
                    own = getattr(self, f"option_state_{i}_{key}_{j}", None)
                    if own is not None and own is not module._buffers[name]:
                        own.copy_(module._buffers[name])

    # -- masked -----------------------------------------------------------------------------------------
    def _masked(self, i: int, block: nn.Module, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = None
        for k, opt in enumerate(self.options):
            if not self._allowed[i][k]:
                continue
            self._use_state(i, k)
            y = block.skip(h) if opt.skip else block(h, opt)
            y = y * rows(mask[:, k], y)
            out = y if out is None else out + y
        return out

    # -- routed -----------------------------------------------------------------------------------------
    def _run_sorted(self, block: nn.Module, h: torch.Tensor, option: torch.Tensor,
                    keep: torch.Tensor | None = None, *, count: torch.Tensor | None = None,
                    mix: torch.Tensor | None = None):
        """The block over the samples of ``h`` that ``keep`` (B,) bool selects (default: all), each at its
        ``option``, in one pass with each option's samples contiguous (by option, then by row): the outputs and
        the rows they belong to, or None where no sample is kept. The group sizes are the one value it reads on
        the host (a GPU waits once per pass); ``count`` (B,) bool is counted in the same read and its number
        returned third. ``mix``: the (B, K) masks whose input mixing the block's layers form (execution
        ``conv``)."""
        k = len(self.options)
        key = option if keep is None else torch.where(keep, option, k)  # k: not run, sorted last
        order = torch.argsort(key, stable=True)
        sizes = torch.bincount(key, minlength=k + 1)
        if count is not None:
            sizes = torch.cat([sizes, count.sum().view(1)])
        counts = sizes.tolist()
        groups, start = [], 0
        for o, c in enumerate(counts[:k]):
            if c:
                groups.append((start, start + c, self.options[o]))
                start += c
        if not start:
            return None
        rows = order[:start]
        prec = MixedPrecision(tuple(groups), self.weight_bits,
                              mix=None if mix is None else ConvMix(mix.index_select(0, rows), self._acts))
        if start == len(h) and torch.is_grad_enabled() and h.requires_grad:  # every sample: a permutation
            out = block(Permute.apply(h, rows, inverse(rows)), prec), rows
        else:
            out = block(h.index_select(0, rows), prec), rows
        return out if count is None else (*out, counts[-1])

    def _nonskip(self, i: int) -> torch.Tensor:
        """(K,) bool: the non-skip options block ``i`` allows (a forward group's options: ``same_fw``'s diagonal)."""
        return self.gate.allowed[i] & self.same_fw.diagonal()

    def _alternatives(self, i: int, choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One non-skip option per sample other than its choice, drawn uniformly (methods.md §6.3): ``sampled``
        from the options; ``grouped`` from the forward groups (FW bit-widths) other than the choice's, the
        group's first option standing for it. Returns (option (B,), the number of candidates it was drawn from
        (B,), 0 where there was none)."""
        cand = self._nonskip(i).unsqueeze(0).expand(len(choice), -1).clone()
        if self.routed_estimator == "grouped":
            cand &= self.fw_first.unsqueeze(0)
            cand &= ~self.same_fw[choice]  # the choice's own forward group: its outputs are the chosen ones
        else:
            cand[torch.arange(len(choice), device=choice.device), choice] = False
        count = cand.sum(1)
        weights = cand.to(torch.float32) + (count == 0).unsqueeze(1).to(torch.float32)  # rows without a candidate
        return torch.multinomial(weights, 1).squeeze(1), count.to(torch.float32)

    def _alt_weight(self, i: int, choice: torch.Tensor, alt: torch.Tensor, candidates: torch.Tensor,
                    rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``RoutedOutput``'s (n, K) weight for the alternatives ``alt`` of samples ``rows``: a computed sample's
        drawn option (``grouped``: every option of its forward group) times the number of candidates; a skipped
        one's every non-skip option alike, y_a standing in for each (methods.md §6.3)."""
        a, skipped = alt[rows], choice[rows] == self.skip_index
        on_alt = (torch.nn.functional.one_hot(a, len(self.options)).bool() if self.routed_estimator == "sampled"
                  else self.same_fw[a]).to(dtype)
        return torch.where(skipped.unsqueeze(1), self._nonskip(i).to(dtype).expand(len(rows), -1),
                           on_alt * candidates[rows].unsqueeze(1).to(dtype))

    def _estimates(self, i: int, block: nn.Module, h: torch.Tensor, choice: torch.Tensor,
                   drawn: tuple[torch.Tensor, torch.Tensor] | None = None, pool: torch.Tensor | None = None,
                   ready: tuple[torch.Tensor, torch.Tensor] | None = None,
                   ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The forward-only alternatives of ``routed_estimator`` for ``RoutedOutput``: (outputs, rows, (n, K)
        weight on ``<g, y_alt - y_own>`` per option), methods.md §6.3. ``drawn``: the alternatives, if already
        drawn; ``pool``: (B,) bool, the samples that still need theirs run (default: every sample); ``ready``:
        (outputs, rows) of the drawn alternatives already run for the other samples, outputs None where they are
        the rows ``rest`` of ``RoutedOutput``'s pass (``exact`` runs its own for all)."""
        alts = []
        with torch.no_grad(), frozen_state(block):
            if self.routed_estimator == "exact":  # every other forward group, for every sample: masked's gradient
                for r in (r for r, first in enumerate(self._fw_first) if first and self._allowed[i][r]):
                    run = self._run_sorted(block, h, torch.full_like(choice, r), ~self.same_fw[choice, r])
                    if run is not None:
                        y, rows = run
                        alts.append((y, rows, self.same_fw[r].to(h.dtype).expand(len(rows), -1)))
                return alts
            alt, candidates = self._alternatives(i, choice) if drawn is None else drawn
            if ready is not None and len(ready[1]):
                y, rows = ready
                alts.append((None if y is None else y.detach(), rows,
                             self._alt_weight(i, choice, alt, candidates, rows, h.dtype)))
            keep = candidates > 0  # a sample whose choice is the block's only option has no contrast
            keep = keep if pool is None else keep & pool
            scale = 1.0
            if self.sample_fraction < 1.0:
                # the alternative runs for a random subset S of the pool (``sample_fraction`` p of it), its
                # contrast weighted by 1/p, so the estimate stays unbiased at p times the cost
                members = keep.nonzero().squeeze(1)
                m = len(members)
                if m == 0:
                    return alts
                size = max(1, round(self.sample_fraction * m))
                if size < m:
                    subset = members[torch.randperm(m, device=choice.device)[:size].sort().values]
                    keep = torch.zeros_like(keep).index_fill_(0, subset, True)
                scale = m / size
            run = self._run_sorted(block, h, alt, keep)
        if run is not None:
            y, rows = run
            alts.append((y, rows, self._alt_weight(i, choice, alt, candidates, rows, h.dtype) * scale))
        return alts

    def _routed(self, i: int, block: nn.Module, h: torch.Tensor, choice: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        skip_k = self.skip_index
        can_skip = skip_k is not None and self._allowed[i][skip_k]
        if not can_skip:  # every sample computes; the value is the chosen output
            y = self._every_sample(block, h, choice)
            return y * rows(mask.gather(1, choice.unsqueeze(1)), y)
        self._use_state(i, skip_k)
        y_skip = block.skip(h)
        self._use_state(i, self._computed_k)  # every computed option shares one pass, so one set of statistics
        estimate = self.routed_estimator != "skip" and self.training and torch.is_grad_enabled()
        skipped = choice == skip_k
        if self.routed_statistics == "batch" and self.training:
            # the samples that skip run the pass too, at a drawn alternative, so its batch statistics cover the
            # whole batch (methods.md §6.3); their outputs only serve the estimator, as its alternative
            drawn = self._alternatives(i, choice)
            y_all, rows_all, n_skipped = self._run_sorted(block, h, torch.where(skipped, drawn[0], choice),
                                                          count=skipped)
            # split the pass's rows: the computed ones first, then the skipped ones, each part in the pass's order
            # (index_select by a stable sort and the count read with the group sizes, where a bool index waits)
            split = skipped.index_select(0, rows_all)
            order = torch.argsort(split.to(torch.uint8), stable=True)
            n = len(rows_all) - n_skipped
            run, rest = order[:n], order[n:]
            pool, ready = ~skipped, (None, rows_all.index_select(0, rest))  # None: the pass's rows ``rest``
            alts = self._estimates(i, block, h, choice, drawn, pool, ready) if estimate else []
            return RoutedOutput.apply(y_all, y_skip, mask, rows_all, (run, rest), skip_k, alts)
        run = self._run_sorted(block, h, choice, ~skipped)
        y_run, computed = run if run is not None else (y_skip[:0], choice.new_zeros(0))
        alts = self._estimates(i, block, h, choice) if estimate else []
        return RoutedOutput.apply(y_run, y_skip, mask, computed, None, skip_k, alts)

    def _every_sample(self, block: nn.Module, h: torch.Tensor, choice: torch.Tensor,
                      mix: torch.Tensor | None = None) -> torch.Tensor:
        """The block over every sample at its ``choice`` in one pass (``_run_sorted``), its outputs in the
        batch's order."""
        y, rows_run = self._run_sorted(block, h, choice, mix=mix)
        return y.index_select(0, torch.argsort(rows_run))

    # -- conv -------------------------------------------------------------------------------------------
    def _conv(self, block: nn.Module, h: torch.Tensor, choice: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """FracTrain's ImageNet design: one pass of the block, each sample at its choice, its quantized layers
        mixing their inputs over the options (``ConvMix``); the output is not weighted by the mask (the
        reference's error mixing ``sum_k sg(m_k) Qg_k(dy)`` is the pass's per-sample error quantization)."""
        return self._every_sample(block, h, choice, mix=mask)

    # -- forward ----------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, forced: torch.Tensor | None = None) -> tuple[torch.Tensor, GateTrace]:
        """Logits and the gate's decisions. ``forced`` (B, L) overrides the choices (tests, analysis)."""
        with weights_fixed():  # every pass of this forward quantizes a weight once per bit-width
            return self._forward(x, forced)

    def _forward(self, x: torch.Tensor, forced: torch.Tensor | None) -> tuple[torch.Tensor, GateTrace]:
        bb = self.backbone
        h = bb.features(x, FP32)  # the layer map keeps the stem fp32 in DFQ
        state = None
        masks, choices, probs, raw = [], [], [], []
        priced = self._priced()
        for i, block in enumerate(bb.blocks):
            z, state = self.gate.step(i, bb.gate_summary(h), state)
            raw.append(z.detach())
            if priced:  # the decision argmax_k (z_lk - price * c_lk) (methods.md §6.5)
                z = z - self.price * self.option_cost[i]
            p = torch.softmax(z, dim=-1)
            choice, mask = straight_through(p)
            if forced is not None or self._floored(i):
                choice = forced[:, i] if forced is not None else floor_skips(p, choice, self.skip_index,
                                                                               self.block_floor)
                mask = torch.nn.functional.one_hot(choice, p.shape[-1]).to(p.dtype) + (p - p.detach())
            if self.execution == "masked":
                h = self._masked(i, block, h, mask)
            elif self.execution == "conv":
                h = self._conv(block, h, choice, mask)
            else:
                h = self._routed(i, block, h, choice, mask)
            masks.append(mask)
            choices.append(choice)
            probs.append(p)
        logits = bb.head(h, FP32)
        return logits, GateTrace(torch.stack(masks, 1), torch.stack(choices, 1), torch.stack(probs, 1),
                                 torch.stack(raw, 1))

    def _floored(self, i: int) -> bool:
        """Whether block ``i``'s decisions go through ``floor_skips``: a floor is set, the block may skip and
        has an option that computes."""
        k = self.skip_index
        return (self.block_floor > 0 and k is not None and self._allowed[i][k]
                and any(a for j, a in enumerate(self._allowed[i]) if j != k))

    def gate_macs(self) -> int:
        """Forward MACs of the gate for one input (embeddings, LSTM steps, projection); kept apart. A language
        model's gate runs once per sequence, so per token it is this divided by the sequence length."""
        g = self.gate
        lstm = 4 * g.lstm.hidden_size * (g.lstm.input_size + g.lstm.hidden_size)
        emb = sum(e.macs() for e in g.embeds)
        return emb + len(g.embeds) * (lstm + g.proj.in_features * g.proj.out_features)
