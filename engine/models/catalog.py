"""The model zoo's names and what each learns, free of torch: a config or a sweep spec is read and checked against
this catalog without importing the zoo (engine.models.zoo builds the models; ``register_model`` refuses a name
missing here, and a test holds the two to the same names). Also the ``LayerMap``, the layer roles that follow
the scheduled precision (docs/methods.md §3, §9): a config resolves it, the models apply it."""

from __future__ import annotations

from dataclasses import dataclass

from engine.metrics import Task
from engine.numerics.precision import FP32, Precision

CIFAR_RESNETS = tuple(f"resnet{d}" for d in (8, 14, 20, 38, 74, 110, 164))
IMAGE_CLASSIFIERS = (*CIFAR_RESNETS, "tiny", "resnet18", "resnet34", "mobilenetv2")
LANGUAGE_MODELS = ("transformer_base", "transformer_small", "transformer_tiny")  # engine.models.transformer.PRESETS
NAMES = (*IMAGE_CLASSIFIERS, *LANGUAGE_MODELS)
# the models whose blocks hold depthwise convs, which run at their fixed ``quant.depthwise_*`` bits whatever a
# gate decides: what a block costs at an option depends on their share of its MACs (docs/methods.md §6.4)
WITH_DEPTHWISE = ("mobilenetv2",)


def task_of(name: str) -> Task:
    """What the model ``name`` learns: a causal Transformer LM (text data, token inputs, per-token costs) or an
    image classifier."""
    return Task.LANGUAGE_MODEL if name in LANGUAGE_MODELS else Task.CLASSIFIER


def is_language_model(name: str) -> bool:
    return task_of(name) is Task.LANGUAGE_MODEL


def unknown_model(name: str) -> str | None:
    """What is allowed, where ``name`` is no model of the zoo: the one rule for a config's ``model.name`` and
    for ``build_model`` called directly."""
    return None if name in NAMES else f"allowed: {', '.join(sorted(NAMES))}"


@dataclass(frozen=True)
class LayerMap:
    """Which layer roles follow the scheduled precision; the rest run fp32 (or at a fixed precision)."""

    stem: bool = True
    fc: bool = False
    head: bool = True
    depthwise: Precision | None = None  # fixed precision of depthwise convs; None: follow the schedule
    embed: bool = False  # a language model's token embedding (weights at FW, its gradient at BW)
    shortcut: bool = True  # a residual block's 1x1 projection (fp32 in the reference's ImageNet ResNets)

    def resolve(self, role: str, prec: Precision) -> Precision:
        """The precision a layer of ``role`` runs at when the schedule says ``prec``."""
        if prec.is_fp32 or role == "body":
            return prec
        if role == "attn":  # activation x activation: both operands at the FW bits (methods.md §11)
            return prec if prec.skip else Precision(act=prec.act, weight=prec.act, grad=prec.grad)
        if role == "depthwise":
            return self.depthwise if self.depthwise is not None else prec
        follows = {"stem": self.stem, "fc": self.fc, "head": self.head, "embed": self.embed,
                   "shortcut": self.shortcut}[role]
        return prec if follows else FP32
