"""Every model builds for Fashion-MNIST (1x28x28) and CIFAR (3x32x32) shapes and trains a step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.errors import ConfigError
from engine.models import MODELS, build_model, is_language_model
from engine.numerics.precision import FP32, Precision

SHAPES = [(1, 28, 28), (3, 32, 32)]


@pytest.mark.parametrize("name", sorted(n for n in MODELS if not is_language_model(n)))  # LMs: test_transformer
@pytest.mark.parametrize("shape", SHAPES, ids=["fmnist", "cifar"])
def test_forward_shapes(name, shape):
    torch.manual_seed(0)
    model = build_model(name, shape[0], 10)
    x = torch.randn(2, *shape)
    for prec in (FP32, Precision.fwbw(8, 8)):
        assert model(x, prec).shape == (2, 10)


def test_the_catalog_names_exactly_the_zoo():
    """A config is checked against the torch-free catalog; the zoo registers the same names, and a builder under
    a name the catalog lacks is refused when it registers."""
    from engine.models import catalog, transformer
    from engine.models.base import register_model

    assert set(MODELS) == set(catalog.NAMES) and len(catalog.NAMES) == len(set(catalog.NAMES))
    assert set(transformer.PRESETS) == set(catalog.LANGUAGE_MODELS)
    # the config's reach rule names these models without building them: exactly those with depthwise layers
    assert set(catalog.WITH_DEPTHWISE) == {n for n in catalog.IMAGE_CLASSIFIERS if any(
        x.role == "depthwise" for x in build_model(n, 3, 10).layer_table((3, 32, 32)))}
    with pytest.raises(RuntimeError, match="resnet9000"):
        register_model("resnet9000")(lambda **kw: None)
    assert "resnet9000" not in MODELS


def test_depths_and_blocks():
    counts = {n: build_model(n, 3, 10).num_blocks for n in ("resnet20", "resnet38", "resnet74", "resnet110", "resnet164")}
    assert counts == {"resnet20": 9, "resnet38": 18, "resnet74": 36, "resnet110": 54, "resnet164": 54}
    assert build_model("mobilenetv2", 3, 10).num_blocks == 17
    assert build_model("resnet18", 3, 1000).num_blocks == 8
    assert build_model("resnet34", 3, 1000).num_blocks == 16
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in build_model("resnet164", 3, 10).modules())
    assert convs == 1 + 54 * 3 + 3  # stem + three convs per bottleneck + three projections


def test_quantized_step_reduces_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    model = build_model("tiny", 1, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,))
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(x, Precision.fwbw(4, 8)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]


def test_layer_roles_follow_the_reference_map():
    m = build_model("resnet20", 3, 10)
    roles = {layer.role for layer in m.layer_table((3, 32, 32))}
    assert roles == {"stem", "body", "shortcut", "fc"}
    assert m.stem_quantized_by_default is True and m.shortcut_quantized_by_default is True
    imagenet = build_model("resnet18", 3, 10)
    assert imagenet.stem_quantized_by_default is False and imagenet.shortcut_quantized_by_default is False
    mb = build_model("mobilenetv2", 3, 10)
    assert {layer.role for layer in mb.layer_table((3, 32, 32))} == {"stem", "body", "shortcut", "depthwise", "head",
                                                                      "fc"}


def test_unknown_model():
    with pytest.raises(ConfigError, match="model.name: got 'resnet39'; allowed: .*resnet38"):
        build_model("resnet39", 3, 10)
