"""The one experiment configuration, validated once at the boundary (architecture rule 4).

``ExperimentConfig`` is a frozen pydantic model with ``extra="forbid"`` at every level; schedule kinds are
a discriminated union on ``kind``. ``load_config(path, overrides)`` reads YAML through ``engine.safe_yaml`` (the guarded reader), applies
``--set key.path=value`` overrides and turns every validation problem into a ``ConfigError`` that names
the field, the value and what is allowed.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from engine import safe_yaml
from engine.config.gated_schedule import DFQSchedule, FracTrainSchedule
from engine.config.problems import validation_problems
from engine.config.schedule import CPTSchedule, FP32Schedule, PFQSchedule, StaticSchedule
from engine.config.sections import (
    CostConfig,
    DataConfig,
    DebugConfig,
    EngineConfig,
    InitConfig,
    ModelConfig,
    OptimConfig,
    QuantConfig,
)
from engine.config.types import MAX_ITERATIONS, Seed, Strict
from engine.data.catalog import INFO
from engine.errors import ConfigError
from engine.models.catalog import WITH_DEPTHWISE, LayerMap, is_language_model
from engine.numerics.precision import Precision
from engine.run_length import RunLength
from engine.schedules.curves import cycles_problem

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


SCHEDULE_CONFIGS = (FP32Schedule, StaticSchedule, PFQSchedule, CPTSchedule, DFQSchedule, FracTrainSchedule)
Schedule = Annotated[
    FP32Schedule | StaticSchedule | PFQSchedule | CPTSchedule | DFQSchedule | FracTrainSchedule,
    Field(discriminator="kind"),
]
# the kinds whose precision a gate picks, for code that holds a kind's name (a logged row) rather than a config
GATED_KINDS = tuple(c.model_fields["kind"].default for c in SCHEDULE_CONFIGS if c.gated)


class ExperimentConfig(Strict):
    name: str = Field("experiment", pattern=NAME_PATTERN)
    seed: Seed = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # data-parallel workers of this run (methods.md §12): data.batch_size is each worker's, a step trains on
    # workers * batch_size samples; more than one runs on Ray Train (fractune train --workers, resources.workers)
    workers: int = Field(1, ge=1, le=1024)
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    quant: QuantConfig = QuantConfig()
    schedule: Schedule = FP32Schedule()
    cost: CostConfig = CostConfig()
    debug: DebugConfig = DebugConfig()
    init: InitConfig | None = None  # start from a pretrained model's weights
    engine: EngineConfig = EngineConfig()

    @field_validator("engine")
    @classmethod
    def _compiled_kinds(cls, v: EngineConfig, info) -> EngineConfig:
        schedule = info.data.get("schedule")
        if v.compile != "off" and schedule is not None and schedule.gated:
            raise PydanticCustomError(
                "engine_compile", "compile {c} with schedule kind {k}; allowed: off for dfq and fractrain (their "
                "routed groups change shape every step), any value for fp32, static, pfq and cpt",
                {"c": v.compile, "k": schedule.kind})
        return v

    @property
    def gated(self) -> bool:
        """DFQ and FracTrain: a gate picks the blocks' precision per input."""
        return self.schedule.gated

    @property
    def act_momentum(self) -> float:
        """The activation running range's EMA weight on the old value: ``quant.act_momentum``, or the
        reference's default for the method (0.1 in FracTrain's CIFAR script, 0.9 in its ImageNet script and in
        the others)."""
        if self.quant.act_momentum is not None:
            return self.quant.act_momentum
        return 0.1 if self.schedule.kind == "fractrain" and self.data.dataset != "imagenet" else 0.9

    def run_length(self, train_size: int | None = None) -> RunLength:
        """The one run-length formula: ``optim.iterations`` when set, else ``optim.epochs`` whole epochs. From the
        data set's known size (previews, validation, the orchestrator), or the loaded split's (``train_size``)."""
        ipe = self.data.iterations_per_epoch(train_size, self.workers)
        return RunLength(self.optim.iterations or self.optim.epochs * ipe, ipe)

    def layer_map(self, stem_default: bool, shortcut_default: bool = True) -> LayerMap:
        """The explicit layer-precision map of this run (methods.md §3). Gated methods keep the stem,
        the MobileNetV2 head conv and the FC in fp32, as the reference's DFQ models do; so does any run of
        ``quant.layer_map: gated``. The defaults are the model family's (``QModel.*_quantized_by_default``)."""
        q = self.quant
        dw = Precision(act=q.depthwise_act_bits, weight=q.depthwise_weight_bits, grad=q.depthwise_grad_bits)
        shortcut = shortcut_default if q.quantize_shortcut is None else q.quantize_shortcut
        if self.gated or q.layer_map == "gated":
            return LayerMap(stem=False, fc=False, head=False, depthwise=dw, shortcut=shortcut)
        stem = stem_default if q.quantize_stem is None else q.quantize_stem
        return LayerMap(stem=stem, fc=q.quantize_fc, head=q.quantize_head, depthwise=dw, embed=q.quantize_embedding,
                        shortcut=shortcut)

    def layer_map_of(self, model) -> LayerMap:
        """``layer_map`` with ``model``'s family defaults (its ``*_quantized_by_default``)."""
        return self.layer_map(model.stem_quantized_by_default, model.shortcut_quantized_by_default)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# ---------------------------------------------------------------------------------------------------
# Loading, overrides and error translation


def set_path(tree: dict, dotted: str, value: Any) -> dict:
    """The one dotted-path setter (``--set`` overrides, a sweep's ``set:`` and its parameters): sets
    ``tree[a][b][c] = value`` for ``a.b.c``, creating missing or null sections; a deep copy of ``value`` is
    stored, so later changes to the tree never reach the caller's object. A path may be no deeper than a YAML
    file may nest (``safe_yaml.MAX_DEPTH``): deeper trees would exhaust Python's recursion while validated."""
    keys = dotted.split(".")
    if len(keys) > safe_yaml.MAX_DEPTH:
        raise ConfigError.single(dotted, value, f"allowed: a dotted path of at most {safe_yaml.MAX_DEPTH} keys")
    node = tree
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError.single(dotted, value, f"{key} is not a section")
        node = child
    node[keys[-1]] = copy.deepcopy(value)
    return tree


def apply_overrides(tree: dict, overrides: list[str] | None) -> dict:
    """``key.path=value`` strings; values are parsed as YAML scalars/lists (``8``, ``0.1``, ``[3,4]``)."""
    for item in overrides or []:
        if "=" not in item or not re.match(r"^[A-Za-z_][\w.-]*=", item):
            raise ConfigError.single("--set", item, "expected key.path=value")
        key, raw = item.split("=", 1)
        if not all(key.split(".")):
            raise ConfigError.single("--set", item, "expected key.path=value (no empty key between dots)")
        set_path(tree, key, safe_yaml.loads(raw, f"--set {key}", None) if raw != "" else None)
    return tree


def read_yaml(path: str | Path, field: str = "config") -> dict:
    """A user's YAML file as a mapping, through the one guarded reader (``engine.safe_yaml``: regular files
    only, size, depth and alias limits, duplicate keys refused, strict UTF-8)."""
    data = safe_yaml.read_yaml_file(path, field)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError.single(field, type(data).__name__, "expected a mapping of settings at the top level")
    return data


def task_problem(model: str, dataset: str, dataset_field: str = "data.dataset") -> tuple[str, object, str] | None:
    """A language model trains on a text corpus, an image classifier on an image data set: the one rule, for a
    config (``cross_field_problems``) and for ``fractune cost``'s flags."""
    is_text = INFO[dataset].is_text
    if is_language_model(model) == is_text:
        return None
    return ("model.name", model, f"allowed with {dataset_field} {dataset}: "
            + ("a transformer_* language model" if is_text else "an image classifier, not a transformer_*"))


def cross_field_problems(cfg: ExperimentConfig) -> list[tuple[str, object, str]]:
    """Checks that need more than one section (the run's length comes from optim and data)."""
    problems = []
    split = cfg.data.split
    if split is not None and cfg.data.dataset == "imagenet":
        problems.append(("data.split", split.by, "allowed: null with data.dataset imagenet (in-memory data sets only)"))
    elif split is not None and INFO[cfg.data.dataset].is_text:
        problems.append(("data.split", split.by, f"allowed: null with data.dataset {cfg.data.dataset} (text "
                         "corpora are not split into parts)"))
    elif split is not None and split.by == "classes" and split.parts > INFO[cfg.data.dataset].classes:
        problems.append(("data.split.parts", split.parts,
                         f"allowed: <= {INFO[cfg.data.dataset].classes} (the classes of {cfg.data.dataset})"))
    elif split is not None and split.parts > (per_class := INFO[cfg.data.dataset].train_size
                                              // INFO[cfg.data.dataset].classes):
        problems.append(("data.split.parts", split.parts, f"allowed: <= {per_class} (every part takes samples of "
                         f"every class; {cfg.data.dataset} has about {per_class} training samples per class)"))
    if cfg.data.vocab_size is not None and not INFO[cfg.data.dataset].is_text:
        problems.append(("data.vocab_size", cfg.data.vocab_size, f"allowed: null with data.dataset "
                         f"{cfg.data.dataset} (an image data set has no vocabulary)"))
    sched = cfg.schedule
    is_lm = is_language_model(cfg.model.name)
    if problem := task_problem(cfg.model.name, cfg.data.dataset):
        problems.append(problem)
        return problems
    if cfg.quant.layer_map == "gated":  # the gated map keeps these fp32; a config cannot ask for both
        problems += [(f"quant.{key}", True, "allowed: null/false with quant.layer_map gated (it keeps the stem, "
                      "the FC, the head conv and the embedding fp32)")
                     for key in ("quantize_stem", "quantize_fc", "quantize_embedding") if getattr(cfg.quant, key)]
    if is_lm and cfg.quant.quantize_stem:
        problems.append(("quant.quantize_stem", True, "allowed: null/false with a language model (no stem; "
                         "see quant.quantize_embedding)"))
    if is_lm and cfg.quant.quantize_shortcut:
        problems.append(("quant.quantize_shortcut", True, "allowed: null/false with a language model (its "
                         "residual connections have no projection)"))
    total = cfg.run_length().total_iterations
    if total > MAX_ITERATIONS:
        field = "optim.iterations" if cfg.optim.iterations else "optim.epochs"
        problems.append((field, getattr(cfg.optim, field.split(".")[1]),
                         f"allowed: a run of at most {MAX_ITERATIONS:.0e} iterations (this one: {total:.3g})"))
        return problems
    if sched.kind == "cpt" and (problem := cycles_problem(sched.num_cycles, total)):
        problems.append(problem)
    if cfg.gated:
        if is_lm:  # methods.md §11.1: the gate sets the blocks' precision only
            problems += [(f"quant.{key}", True, f"allowed: false with schedule.kind {sched.kind} (the embedding and "
                          "the output layer stay fp32)")
                         for key in ("quantize_fc", "quantize_embedding") if getattr(cfg.quant, key)]
        elif cfg.quant.quantize_stem or cfg.quant.quantize_fc:
            problems.append(("quant.quantize_stem" if cfg.quant.quantize_stem else "quant.quantize_fc", True,
                             f"allowed: null/false with schedule.kind {sched.kind} (the stem and FC stay fp32)"))
        problems += target_problems(cfg)
        if sched.routed_warmup and sched.execution != "routed":
            problems.append(("schedule.routed_warmup", sched.routed_warmup,
                             "allowed: 0 unless schedule.execution is routed (the warm-up runs masked first)"))
        if sched.routed_statistics != "computed" and sched.execution != "routed":
            problems.append(("schedule.routed_statistics", sched.routed_statistics,
                             "allowed: computed unless schedule.execution is routed (masked runs every option "
                             "over the whole batch)"))
        if sched.execution == "conv":
            problems += conv_problems(cfg, is_lm)
        if sched.routed_sample_fraction < 1 and (sched.execution != "routed"
                                                 or sched.routed_estimator not in ("sampled", "grouped")):
            problems.append(("schedule.routed_sample_fraction", sched.routed_sample_fraction,
                             "allowed: 1 unless schedule.execution is routed with routed_estimator sampled "
                             "or grouped"))
    return problems


def conv_problems(cfg: ExperimentConfig, is_lm: bool) -> list[tuple[str, object, str]]:
    """What execution conv (the reference's ImageNet design, methods.md §6.3) cannot run: a skip option (every
    sample computes every block), a language model (it mixes the inputs of a block's convs), a gate_dim (its
    embedding is one layer)."""
    sched = cfg.schedule
    problems = []
    if is_lm:
        problems.append(("schedule.execution", "conv", "allowed: masked or routed with a language model (conv "
                         "mixes the inputs of the convs of an image network's blocks)"))
    names = sched.option_names(cfg.model.name)
    if "skip" in names:
        problems.append(("schedule.options", sched.options if isinstance(sched.options, str) else names,
                         "allowed: options without skip with schedule.execution conv (every sample computes "
                         "every block), e.g. [3/6, 4/8, 6/12, 8/16]"))
    if sched.gate_dim is not None:
        problems.append(("schedule.gate_dim", sched.gate_dim, "allowed: null with schedule.execution conv (its "
                         "gate embeds each block input with one layer, to embed_dim)"))
    return problems


def option_cp(option: Precision) -> float:
    """The gated cp (percent of FP32) of every block at ``option``, ``100 kappa / 3`` (engine.dfq.gate's
    ``option_kappa``; a skip at no cost, which only the built network prices at its path)."""
    return 100 * option.bitops_per_mac() / 1024.0 / 3


def target_problems(cfg: ExperimentConfig, reach: tuple[float, float] | None = None) -> list[tuple[str, object, str]]:
    """A cp target the options cannot reach. ``reach``: the run's lowest and highest cp on its basis, known once
    the network is built (engine.dfq.basis, a skip priced at what its path runs); without it, from the config
    alone, the bound over the gated blocks with every sample at the cheapest or the dearest option (a skip at
    no cost); on the whole model, and over blocks with depthwise convs at their fixed bits, the config alone
    sets no bound."""
    from engine.dfq.vocabulary import BASIS_WORDS

    sched = cfg.schedule
    if reach is None:
        if sched.cost_basis == "model" or cfg.model.name in WITH_DEPTHWISE:
            return []
        cps = [option_cp(o) for o in sched.option_precisions(cfg.model.name)]
        reach = min(cps), max(cps)
    lo, hi = reach
    allowed = f"allowed: {lo:.3f}..{hi:.3f} (percent of FP32 {BASIS_WORDS[sched.cost_basis]} with options " \
              f"{', '.join(sched.option_names(cfg.model.name))} at {sched.weight_bits}-bit weights)"
    inside = lambda t: lo - 1e-9 <= t <= hi + 1e-9  # noqa: E731  (a reach computed in floats)
    if sched.kind == "dfq":
        return [] if inside(sched.target_cp) else [("schedule.target_cp", sched.target_cp, allowed)]
    field = "schedule.cp0" if sched.cp_total is None else "schedule.cp_total"
    value = sched.cp0 if sched.cp_total is None else sched.cp_total
    bad = [t for t in sched.targets() if not inside(t)]
    return [(field, value, f"stage targets {bad} unreachable; {allowed}")] if bad else []


def target_undecided(cfg: ExperimentConfig) -> bool:
    """Whether the config alone cannot tell that a gated run's cp targets are reachable, so that only the built
    network can (``engine.reach``): on the whole-model basis always; on the gated blocks a target below the
    cheapest option that computes, which only skips reach, at what their paths cost (a downsampling block's
    fp32 projection), and any target where the blocks hold depthwise convs at their fixed bits, which every
    option's cost includes in proportion to their MACs. Otherwise between the cheapest and the dearest computing
    option every target is reachable."""
    sched = cfg.schedule
    if not cfg.gated:
        return False
    if sched.cost_basis == "model" or cfg.model.name in WITH_DEPTHWISE:
        return True
    cheapest = min(option_cp(o) for o in sched.option_precisions(cfg.model.name) if not o.skip)
    targets = [sched.target_cp] if sched.kind == "dfq" else sched.targets()
    return any(t < cheapest - 1e-9 for t in targets)


def parse_config(tree: dict, source: str | None = None) -> ExperimentConfig:
    try:
        cfg = ExperimentConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc, ExperimentConfig), source) from None
    problems = cross_field_problems(cfg)
    if problems:
        raise ConfigError(problems, source)
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    tree = apply_overrides(read_yaml(path), overrides)
    return parse_config(tree, source=None)
