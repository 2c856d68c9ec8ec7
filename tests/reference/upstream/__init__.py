"""The papers' reference code, run beside the engine by the differential tests of ``tests/reference``.

Copies of the authors' repositories at the commits docs/methods.md names (MIT; LICENSE beside this file):

* ``fractrain_quantize.py``, ``fractrain_models.py``: GATECH-EIC/FracTrain@1113ec2
  ``fractrain_cifar/modules/quantize.py`` and ``fractrain_cifar/models.py``;
* ``fractrain_imagenet_quantize.py``, ``fractrain_imagenet_models.py``: the same commit's
  ``fractrain_imagenet/modules/quantize.py`` and ``fractrain_imagenet/models.py`` (``resnet18_rnn``);
* ``cpt_quantize.py``, ``cpt_models.py``, ``cpt_imagenet_models.py``: GATECH-EIC/CPT@a3cf5b0
  ``cpt_cifar/modules/quantize.py`` (``cpt_imagenet/modules/quantize.py`` is the same file),
  ``cpt_cifar/models.py`` and ``cpt_imagenet/models.py``;
* ``fractrain_loops.py``, ``cpt_loops.py``: the lines of the training scripts that decide precision and cost,
  lifted out of their loops (each names the lines it holds);
* ``model_info_mbv2.json``: the values of FracTrain's ``fractrain_cifar/model_info_mbv2.npy`` (sha256
  7f434d7b...9747e605), its per-block FLOPs of MobileNetV2's pointwise (``conv``) and depthwise (``dws``) convs,
  as integers (the ``.npy`` is a pickle of torch tensors, which a test should not unpickle).

The copies differ from the originals in two ways only: ``.cuda()`` is ``.cpu()`` (the tests run on the CPU), and
the models import their quantizers from the copy beside them (``from .fractrain_quantize import``, ``from .fractrain_imagenet_quantize import``). They are kept
as they are, so ruff does not check this folder (pyproject.toml).
"""
