"""Save and restore everything a resumed run needs: model, optimizer, schedule state, BitOPs totals,
history, position and RNG state. One file, ``state.pt``, loaded with ``weights_only=True`` (only tensors,
numbers, strings, lists and dicts: nothing is unpickled as code)."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import torch

from engine.errors import CheckpointError

FILENAME = "state.pt"
FORMAT = 2  # 2: the gated runner keeps its controller and staging state (checkpoints of 1 do not resume)


def save(directory: str | Path, state: dict) -> Path:
    path = Path(directory) / FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"format": FORMAT, **state}, tmp)
    tmp.replace(path)  # atomic: a killed save never leaves a half-written checkpoint
    return path


# what torch's weights-only unpickler says of a class or function it refuses to load (code, not damage)
FOREIGN = re.compile(r"Unsupported (global|class)|not an allowed global")


def _cause(exc: Exception) -> str:
    """The informative line of a load error: torch's weights-only message buries it under advice."""
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    specific = [x for x in lines if "error:" in x.lower() or x.startswith("Unsupported")]
    line = specific[-1] if specific else lines[0] if lines else type(exc).__name__
    return line.split(". ")[0][:200]  # the first sentence: the rest is torch's advice


def load(directory: str | Path, map_location: str | torch.device = "cpu", field: str = "checkpoint") -> dict:
    """The state a run saved in ``directory`` (or the file itself); ``field``: the setting that named it, which
    every refusal names (``init.checkpoint``, ``--resume``)."""
    path = Path(directory)
    path = path / FILENAME if path.is_dir() else path
    if not path.is_file():
        raise CheckpointError(f"{field}: {path} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:  # torch's message advises turning weights_only off: never repeat that
        if FOREIGN.search(str(exc)):
            raise CheckpointError(f"{field}: {path} holds objects other than tensors and plain data; refused "
                                  "(loading it could run code)") from None
        raise CheckpointError(f"{field}: {path} is damaged (not a readable checkpoint: "
                              f"{_cause(exc)})") from None
    except Exception as exc:  # a truncated archive, flipped bytes, an empty file...
        raise CheckpointError(f"{field}: {path} is damaged ({type(exc).__name__}: {_cause(exc)})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{field}: {path} holds a {type(state).__name__}; expected fractune's state dict")
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{field}: {path} has format {state.get('format')!r}; expected {FORMAT}")
    return state


def load_init(init, model_name: str) -> dict:
    """The pretrained weights ``init`` (an ``InitConfig``) names, for a run building ``model_name``: the backbone's
    state dict (a gated run's gate is left out), refused with a one-line error when another architecture wrote
    it. Only the weights are used: optimizer, schedule and BitOPs totals start afresh."""
    if init.checkpoint is None:  # init.run_id alone: the orchestrator resolves it (results.lineage)
        raise CheckpointError(f"init.checkpoint: none for init.run_id {init.run_id}; allowed: a checkpoint folder, "
                              "or run the config with fractune train/sweep --tracking-uri, which resolve the run "
                              "to its final checkpoint")
    state = load(init.checkpoint, field="init.checkpoint")
    written = ((state.get("config") or {}).get("model") or {}).get("name")
    if written != model_name:
        raise CheckpointError(f"init.checkpoint: {init.checkpoint} holds a {written} model; allowed: a checkpoint "
                              f"of model.name {model_name} (this run's model)")
    weights = state["model"]
    if any(k.startswith("backbone.") for k in weights):  # written by a gated (DFQ/FracTrain) run
        weights = {k[len("backbone."):]: v for k, v in weights.items() if k.startswith("backbone.")}
    return weights


def apply_init(backbone, weights: dict, init) -> None:
    """Load ``weights`` into ``backbone``; ``head: reset`` re-initialises the classifier (``fc``) instead of
    loading it. A shape or key mismatch is a ``CheckpointError`` naming the first problem."""
    if init.head == "reset":
        weights = {k: v for k, v in weights.items() if not k.startswith("fc.")}
    try:
        missing, unexpected = backbone.load_state_dict(weights, strict=False)
    except RuntimeError as exc:
        first = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()), str(exc))
        raise CheckpointError(f"init.checkpoint: {init.checkpoint} does not fit this run's model ({first}); "
                              "allowed: a checkpoint of the same model and data set (or head: reset when only "
                              "the classes differ)") from None
    missing = [k for k in missing if not (init.head == "reset" and k.startswith("fc."))]
    if missing or unexpected:
        raise CheckpointError(f"init.checkpoint: {init.checkpoint} does not fit this run's model (missing "
                              f"{missing[:3]}, unexpected {unexpected[:3]}); allowed: a checkpoint of the same model")
    if init.head == "reset":
        backbone.fc.reset_parameters()
        backbone.fc.run_lo.zero_()
        backbone.fc.run_range.zero_()
