"""The MACs tables every cost is counted on (``QModel.layer_table``: BitOPs, the other cost models, a gated run's
cp), beside the papers' networks: each conv and linear layer's multiply-accumulates per sample as forward hooks
count them on the reference's own modules at the data set's input size, and FracTrain's shipped per-block
MobileNetV2 table (``fractrain_cifar/model_info_mbv2.npy``, which ``train_dfq.py --conv_info`` loads for DFQ's cp;
its values are kept as JSON in ``upstream/model_info_mbv2.json``: the file itself is a pickle of torch tensors)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from engine.data.catalog import INFO
from engine.models import build_model
from tests.reference import REFERENCE_CODE_WARNINGS
from tests.reference.test_networks import _backbone_keys, _mobilenet_keys
from tests.reference.upstream import cpt_imagenet_models, cpt_models, fractrain_models

pytestmark = REFERENCE_CODE_WARNINGS

MODEL_INFO = Path(__file__).with_name("upstream") / "model_info_mbv2.json"


def _hooked_macs(ref: torch.nn.Module, size: int, *bits: int) -> dict[str, int]:
    """Per sample, the MACs of every conv and linear layer a forward pass of ``ref`` runs, by module name."""
    macs: dict[str, int] = {}

    def count(name: str):
        def hook(mod, inputs, out):
            if isinstance(mod, torch.nn.Conv2d):
                per_output = mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
                macs[name] = out[0].numel() * per_output
            else:
                macs[name] = mod.in_features * mod.out_features
        return hook

    handles = [mod.register_forward_hook(count(name)) for name, mod in ref.named_modules()
               if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        ref.eval()(torch.randn(1, 3, size, size), *bits)
    for h in handles:
        h.remove()
    return macs


def _imagenet_keys(key: str, value):
    for old, new in (("conv1.", "stem."), ("fc.", "fc.")):
        if key.startswith(old):
            return new + key[len(old):], value
    group, rest = key.split(".", 1)
    g, i = (int(v) for v in group[len("group"):].split("_layer"))
    return f"blocks.{2 * (g - 1) + i}.{rest.replace('downsample.0.', 'proj.')}", value


def _cifar_resnet(module, n, classes):
    def build():
        ref = module.ResNet(module.BasicBlock, [n, n, n], num_classes=classes)
        ref.avgpool = torch.nn.AdaptiveAvgPool2d(1)
        return ref
    return build


CASES = {  # engine model, data set, the reference network, its names for the engine's, its bits arguments
    "cpt-resnet38": ("resnet38", "cifar10", _cifar_resnet(cpt_models, 6, 10), functools.partial(_backbone_keys, n=6), (4, 8)),
    "fractrain-resnet74": ("resnet74", "cifar100", _cifar_resnet(fractrain_models, 12, 100), functools.partial(_backbone_keys, n=12), (4, 8)),
    "fractrain-mobilenetv2": ("mobilenetv2", "cifar10", lambda: fractrain_models.MobileNetV2(num_classes=10),
                              _mobilenet_keys, (4, 8)),
    "cpt-imagenet-resnet18": ("resnet18", "imagenet", lambda: cpt_imagenet_models.resnet18(num_classes=1000),
                              _imagenet_keys, (4, 8)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_layers_macs_are_what_the_reference_network_runs(case, monkeypatch):
    """Layer by layer, under the engine's name for the same weight: the same layers and the same MACs per sample,
    each ``blocks.J`` layer counted in block J (a gated run's block costs and DFQ's ``omega`` sum by block)."""
    model, dataset, build, names, bits = CASES[case]
    if "mobilenet" in case:  # its head pools with F.avg_pool2d(4): the engine's pooling, as test_networks does
        import types

        import torch.nn.functional as F
        monkeypatch.setattr(fractrain_models, "F", types.SimpleNamespace(
            relu=F.relu, avg_pool2d=lambda x, k: F.adaptive_avg_pool2d(x, 1)))
    info = INFO[dataset]
    ref = build()
    theirs = {names(f"{name}.weight", None)[0].rsplit(".", 1)[0]: macs
              for name, macs in _hooked_macs(ref, info.input_shape(None)[-1], *bits).items()}
    ours = build_model(model, info.channels, 1000 if dataset == "imagenet" else info.classes)
    table = ours.layer_table(info.input_shape(None))
    assert {x.name: x.macs for x in table} == theirs
    assert len(table) == len(theirs) > 0
    for x in table:
        parts = x.name.split(".")
        assert x.block == (int(parts[1]) if parts[0] == "blocks" else None), x.name


def test_mobilenetv2_block_macs_are_fractrains_shipped_table():
    """``model_info_mbv2.npy`` counts each of the 17 blocks' pointwise convs (shortcut included) and depthwise
    convs in FLOPs, a multiply-add as two (``compute_flops.py``, ``multiply_adds=True``): the engine's MACs of
    the same block and roles, times two, for every block."""
    shipped = json.loads(MODEL_INFO.read_text())
    ours = build_model("mobilenetv2", 3, 10).layer_table(INFO["cifar10"].input_shape(None))
    blocks = 1 + max(x.block for x in ours if x.block is not None)
    pointwise, depthwise = [0] * blocks, [0] * blocks
    for x in ours:
        if x.block is not None:
            (depthwise if x.role == "depthwise" else pointwise)[x.block] += x.macs
    assert [2 * m for m in pointwise] == shipped["conv"]
    assert [2 * m for m in depthwise] == shipped["dws"]
