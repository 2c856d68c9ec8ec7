"""The sections of an experiment configuration (``engine.config.experiment.ExperimentConfig`` holds one of each):
model, data (with its split), optimizer, quantization, initial weights, cost models, engine and debug switches;
each validated where it stands alone (the rules across sections are ``experiment.cross_field_problems``). Paths a
section names are checked when read (``resolved_path``), so a bad one is refused naming its field."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Literal

from annotated_types import Ge, Lt
from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from engine.config.types import MAX_ITERATIONS, Bits, Items, Seed, Strict
from engine.data.catalog import INFO
from engine.errors import ConfigError
from engine.models.catalog import unknown_model

Fraction = Annotated[float, Ge(0.0), Lt(1.0)]


class DebugConfig(Strict):
    """Fault injection, for testing a deployment's failure handling (docs/reliability.md). Leave unset."""

    nan_loss_at_iteration: int | None = Field(None, ge=0, le=MAX_ITERATIONS)  # the loss becomes NaN at this iteration
    nan_loss_seeds: list[Seed] | None = Field(None, max_length=10000)  # ... only in runs of these seeds (null: every seed)
    sleep_per_iteration: float = Field(0.0, ge=0.0, le=10.0)  # slow a run down (to kill it mid-epoch)
    # ... only while this file exists: a fault test slows its runs until the fault has landed, then removes the
    # file, and what follows (the retry, the resume) runs at full speed
    sleep_while: str | None = Field(None, min_length=1, max_length=4096)


class EngineConfig(Strict):
    """How the training step runs (docs/methods.md §1, "Captured steps"): ``compile`` off (eager), ``default``
    (``torch.compile``: two graphs for any number of precisions, quantizers as the GPU kernels' custom ops) or
    ``reduce-overhead`` (the same, replayed as CUDA graphs on a GPU)."""

    compile: Literal["off", "default", "reduce-overhead"] = "off"


class ModelConfig(Strict):
    name: str = "resnet20"

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if allowed := unknown_model(v):
            raise PydanticCustomError("unknown_model", allowed)
        return v


class SplitConfig(Strict):
    """One part of the training set, for staged runs (FracTrain supplement §5; docs/sweeps.md "Staged sweeps").

    ``by: classes``: the classes (in natural order, or shuffled by ``seed`` with ``shuffle_classes``) cut into
    ``parts`` contiguous groups; the part's training samples and its classes' test samples (adaptation).
    ``by: samples``: every class's training samples, shuffled by ``seed``, cut into ``parts``; each part holds
    every class; the whole test set (fine-tuning). Labels keep their data set indices. The validation split is
    then held out of the part (``val_fraction``, ``split_seed``)."""

    by: Literal["classes", "samples"]
    part: int = Field(0, ge=0)
    parts: int = Field(2, ge=2, le=1000)
    seed: int = Field(0, ge=0, le=2**32 - 1)  # fixed: every run of a scenario sees the same parts
    shuffle_classes: bool = False  # classes: shuffle the class order by seed (false: 0..C-1 in order)

    @model_validator(mode="after")
    def _part_in_range(self) -> SplitConfig:
        if self.part >= self.parts:
            raise PydanticCustomError("split_part", f"allowed: part 0..{self.parts - 1} (parts: {self.parts})")
        return self

    def classes(self, num_classes: int) -> list[int]:
        """The classes of this part (sorted): contiguous groups of the class order, natural or shuffled."""
        import torch

        order = (torch.randperm(num_classes, generator=torch.Generator().manual_seed(self.seed))
                 if self.shuffle_classes else torch.arange(num_classes))
        return sorted(torch.tensor_split(order, self.parts)[self.part].tolist())


NAME_MAX, PATH_MAX = 255, 4096  # bytes, Linux: a longer file name or path is refused by every system call


def resolved_path(v: str) -> str:
    """A user's path made absolute (Ray trials run in another working directory), refused here when no system
    call could take it (a NUL byte, an unpaired surrogate, a name over NAME_MAX or a path over PATH_MAX bytes), so
    the error names the field instead of surfacing from the first open, perhaps inside a trial."""
    import os

    if not v.strip():  # Path("") is the working folder: never what an empty setting meant
        raise PydanticCustomError("path", "allowed: a path, not empty text")
    if "\x00" in v:
        raise PydanticCustomError("path", "allowed: a path without a NUL character")
    try:  # YAML's "\ud800" escape: text that no file name can hold
        os.fsencode(v)
    except UnicodeError:
        raise PydanticCustomError("path", "allowed: a path without an unpaired surrogate") from None
    path = Path(v).expanduser().resolve()
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    if longest > NAME_MAX:
        raise PydanticCustomError("path", "a name in it is {n} bytes; allowed: names of at most {m} bytes",
                                  {"n": longest, "m": NAME_MAX})
    if len(os.fsencode(str(path))) >= PATH_MAX:
        raise PydanticCustomError("path", "allowed: a path of fewer than {m} bytes", {"m": PATH_MAX})
    return str(path)


def check_path(field: str, v: str) -> str:
    """``resolved_path`` for a path given outside a config (a command-line flag): a ``ConfigError`` naming
    ``field``."""
    try:
        return resolved_path(v)
    except PydanticCustomError as err:
        raise ConfigError.single(field, v, err.message()) from None


DatasetName = Literal[tuple(INFO)]  # the data sets engine.data.catalog knows, in its order


class DataConfig(Strict):
    dataset: DatasetName = "fashion-mnist"
    data_dir: str | None = None  # default: the Debian package's folder for fashion-mnist
    download: bool = False  # torchvision download for CIFAR (needs network access)
    batch_size: int = Field(128, ge=1, le=65536)
    eval_batch_size: int = Field(1000, ge=1, le=65536)
    val_fraction: float = Field(0.1, ge=0.0, lt=0.9)  # held out of the training set for model selection
    split_seed: int = Field(0, ge=0, le=2**32 - 1)  # fixed, so every seed of a sweep sees the same split
    train_subset: int | None = Field(None, ge=1)  # use only the first N training samples (quick runs)
    test_subset: int | None = Field(None, ge=1)
    augment: bool = True
    num_workers: int = Field(0, ge=0, le=64)  # DataLoader workers (ImageNet folders only)
    # text data sets (language models): tokens per sequence, and a cap on the vocabulary (the most frequent
    # training words; the rest become <unk>). batch_size / eval_batch_size count sequences, subsets too.
    seq_len: int = Field(256, ge=1, le=65536)
    vocab_size: int | None = Field(None, ge=2)
    split: SplitConfig | None = None  # train on one part of the training set (adaptation, fine-tuning)

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        return None if v is None else resolved_path(v)

    def split_sizes(self) -> tuple[int, int]:
        """(train, val) sample counts, known without reading the data (used by schedule previews); text: training
        sequences (validation is its own split: 0 here)."""
        info = INFO[self.dataset]
        if info.is_text:
            n = (info.tokens - 1) // self.seq_len
            return (n if self.train_subset is None else min(n, self.train_subset)), 0
        total = info.train_size
        if self.split is not None:  # a part of the training set: its expected size (balanced classes)
            share = (len(self.split.classes(info.classes)) / info.classes if self.split.by == "classes"
                     else 1 / self.split.parts)
            total = int(round(total * share))
        n_val = int(round(total * self.val_fraction))
        n_train = total - n_val
        if self.train_subset is not None:
            n_train = min(n_train, self.train_subset)
        return n_train, n_val

    def iterations_per_epoch(self, train_size: int | None = None, workers: int = 1) -> int:
        """Batches per epoch (no drop_last, as the reference); ``train_size``: the loaded split's real size. On
        ``workers`` data-parallel workers a step takes ``workers * batch_size`` samples of an epoch cut to a
        multiple of ``workers`` (methods.md §12)."""
        n = self.split_sizes()[0] if train_size is None else train_size
        return math.ceil((n - n % workers) / (self.batch_size * workers))


class OptimConfig(Strict):
    optimizer: Literal["sgd", "adam"] = "sgd"  # adam: the Transformer's (betas, eps below; no momentum/nesterov)
    betas: Items(tuple[Fraction, Fraction]) = (0.9, 0.98)  # Adam's decay rates, each in [0, 1)
    eps: float = Field(1e-9, gt=0.0, le=1.0)
    epochs: int = Field(1, ge=1, le=100000)
    iterations: int | None = Field(None, ge=1, le=MAX_ITERATIONS)  # a budget in optimizer steps; overrides epochs
    lr: float = Field(0.1, gt=0.0, le=100.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(1e-4, ge=0.0, le=1.0)
    nesterov: bool = False
    lr_schedule: Literal["piecewise", "cosine", "constant"] = "piecewise"
    # cosine: the learning rate anneals from lr to lr * lr_floor (the reference's anneal_cosine: lr * 0.1^2)
    lr_floor: float = Field(0.01, ge=0.0, lt=1.0)
    milestones: Items(tuple[float, ...]) = (0.5, 0.75)  # fractions of the run (paper: epochs 80 and 120 of 160)
    gamma: float = Field(0.1, gt=0.0, le=1.0)
    warmup_iters: int = Field(0, ge=0, le=MAX_ITERATIONS)  # reference --warm_up: a constant lr for the first iterations
    warmup_lr: float = Field(0.01, gt=0.0, le=100.0)

    @field_validator("milestones")
    @classmethod
    def _fractions(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0.0 < x < 1.0 for x in v) or list(v) != sorted(v):
            raise PydanticCustomError("milestones", "allowed: increasing fractions of the run, each in (0, 1)")
        return v


class QuantConfig(Strict):
    # method: each method's own layer map (the reference's); gated: the map DFQ and FracTrain run (stem, FC and
    # MobileNetV2's head conv in fp32), so that a static or CPT arm and a gated arm differ only in the gate's
    # allocation (methods.md §3)
    layer_map: Literal["method", "gated"] = "method"
    quantize_stem: bool | None = None  # None: the reference (quantized on CIFAR models, fp32 on ImageNet)
    # a residual block's 1x1 projection; None: the reference (quantized in CIFAR ResNets and MobileNetV2, at each
    # DFQ option's bits in gated ones, fp32 in ImageNet ResNets)
    quantize_shortcut: bool | None = None
    quantize_fc: bool = False  # the reference keeps the FC in fp32
    quantize_head: bool = True  # MobileNetV2's 1x1 head conv (static methods)
    # EMA weight on the OLD running range (the reference's convention); null: the reference's value for the
    # method, 0.1 for FracTrain (train_frac.py) and 0.9 for every other method (methods.md §1)
    act_momentum: float | None = Field(None, ge=0.0, lt=1.0)
    depthwise_act_bits: Bits = 8  # MobileNetV2 depthwise convs: fixed, not scheduled (reference 8/16)
    depthwise_weight_bits: Bits = 8
    depthwise_grad_bits: Bits = 16
    quantize_embedding: bool = False  # language models: the token embedding's weights at FW, its gradient at BW


Head = Literal["keep", "reset"]  # init.head, and a sweep stage's head (search_spaces.spec.Stage)


class InitConfig(Strict):
    """Start from a pretrained model: the weights of ``checkpoint`` (a run's folder holding ``state.pt``, or the
    file), loaded with ``weights_only=True``; the optimizer, schedule and BitOPs start afresh. ``head: keep``
    loads the classifier too (the supplement's setting: the same model retrained, labels keep their indices);
    ``reset`` re-initialises it (and then also accepts a checkpoint with another number of classes).

    ``run_id`` alone names an MLflow run of an earlier sweep instead: ``fractune train``, ``validate`` and
    ``sweep`` resolve it, through the tracking store, to the final checkpoint that run recorded
    (``results.lineage``); the engine itself reads only ``checkpoint``. With both set, ``run_id`` is the
    lineage of ``checkpoint`` (staged sweeps set both)."""

    checkpoint: str | None = None
    head: Head = "keep"
    run_id: str | None = None  # an MLflow run whose final checkpoint to start from (resolved by the orchestrator)

    @field_validator("checkpoint")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if not v.strip():
            raise PydanticCustomError("checkpoint", "allowed: a folder holding state.pt, or the file")
        return resolved_path(v)

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", v):
            raise PydanticCustomError("run_id", "allowed: an MLflow run id (letters, digits, - and _; at most 64)")
        return v

    @model_validator(mode="after")
    def _source(self) -> InitConfig:
        if self.checkpoint is None and self.run_id is None:
            raise PydanticCustomError("checkpoint", "allowed: init.checkpoint (a folder holding state.pt, or the "
                                      "file) or init.run_id (an MLflow run of an earlier sweep); neither is set")
        return self


class CostConfig(Strict):
    """The hardware cost models every run reports (engine/cost/cost_models.py; docs/methods.md §10)."""

    int_widths: Items(tuple[int, ...]) = (4, 8, 16, 32)  # the int_units model's integer unit widths
    table: str | None = None  # a user's YAML table (width pair -> cost per MAC), reported as table:NAME

    @field_validator("int_widths")
    @classmethod
    def _widths(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(isinstance(w, bool) or not 1 <= w <= 32 for w in v) or list(v) != sorted(set(v)):
            raise PydanticCustomError("int_widths", "allowed: increasing distinct integers 1..32, e.g. [4, 8, 16, 32]")
        return v

    @field_validator("table")
    @classmethod
    def _table(cls, v: str | None) -> str | None:
        if v is None:
            return None
        from engine.cost.cost_models import load_cost_table

        path = resolved_path(v)
        try:
            load_cost_table(path)
        except ConfigError as err:
            msg = "; ".join(a if f == "cost.table" else f"{f}: got {val!r}; {a}" for f, val, a in err.problems)
            raise PydanticCustomError("cost_table", "{msg}", {"msg": msg}) from None
        return path

    def models(self):
        from engine.cost.cost_models import build_models, load_cost_table

        return build_models(self.int_widths, load_cost_table(self.table) if self.table else None)
