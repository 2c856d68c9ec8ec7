"""Save and restore everything a resumed run needs: model, optimizer, schedule state, BitOPs totals,
history, position and RNG state. One file, ``state.pt``, loaded with ``weights_only=True`` (only tensors,
numbers, strings, lists and dicts: nothing is unpickled as code)."""

from __future__ import annotations

import pickle
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


def load(directory: str | Path, map_location: str | torch.device = "cpu") -> dict:
    path = Path(directory)
    path = path / FILENAME if path.is_dir() else path
    if not path.is_file():
        raise CheckpointError(f"checkpoint: {path} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:  # torch's message advises turning weights_only off: never repeat that
        raise CheckpointError(f"checkpoint: {path} holds objects other than tensors and plain data; refused "
                              "(loading it could run code)") from None
    except Exception as exc:
        first = next((x.strip() for x in str(exc).splitlines() if x.strip()), "")
        raise CheckpointError(f"checkpoint: {path} is unreadable ({type(exc).__name__}: {first[:200]})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint: {path} holds a {type(state).__name__}; expected fractune's state dict")
    if state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint: {path} has format {state.get('format')!r}; expected {FORMAT}")
    return state
