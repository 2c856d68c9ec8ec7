"""Building blocks shared by the config sections: the strict base model and the bit-width type."""

from __future__ import annotations

from typing import Annotated, Any

from annotated_types import Ge, Le
from pydantic import BaseModel, BeforeValidator, ConfigDict, field_validator, model_validator
from pydantic_core import PydanticCustomError

from engine.numerics.precision import BITS_ALLOWED, valid_bits


def _bits(value: Any) -> int:
    if not valid_bits(value):
        raise PydanticCustomError("bits", BITS_ALLOWED)
    return value


Bits = Annotated[int, BeforeValidator(_bits)]
MAX_ITERATIONS = 10**9  # a run's iterations (ImageNet, 90 epochs at batch 256: 4.5e5)
SEED_MAX = 2**31 - 1
Seed = Annotated[int, Ge(0), Le(SEED_MAX)]  # a run's seed: ExperimentConfig.seed and a sweep's seeds


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def Items(annotation: Any) -> Any:  # noqa: N802 (a type, spelled as one)
    """A tuple field a YAML list fills: strict validation takes only tuples, so a list is turned into one first
    (its items stay strictly checked)."""
    return Annotated[annotation, BeforeValidator(_as_tuple)]


class Strict(BaseModel):
    """Frozen, unknown keys forbidden, no infinite or NaN numbers, and strict types: a number only where a
    number is written (``true`` is no batch size, ``"64"`` no seed), true/false only for a switch. Pydantic's lax
    mode would run a slip in a YAML file or a ``--set`` (``batch_size=true``: one sample a step) with a value
    nobody wrote. Every config section derives from this."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _plain_scalars(cls, data: Any) -> Any:
        """NumPy scalars (a search algorithm's samples, a notebook's values) as the Python numbers they hold."""
        if isinstance(data, dict) and any(_is_numpy(v) or isinstance(v, list | tuple) for v in data.values()):
            return {k: _plain(v) for k, v in data.items()}
        return data

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, v: Any) -> Any:
        """No text anywhere in a config may hold a NUL byte: no file, folder, name or tag can (the OS refuses
        such paths with ValueError rather than OSError)."""
        if _has_nul(v):
            raise PydanticCustomError("nul", "allowed: text without NUL bytes")
        return v


def _is_numpy(v: Any) -> bool:
    return type(v).__module__ == "numpy" and hasattr(v, "item") and getattr(v, "ndim", None) == 0


def _plain(v: Any) -> Any:
    if _is_numpy(v):
        return v.item()
    if isinstance(v, list | tuple) and any(_is_numpy(x) for x in v):
        return type(v)(x.item() if _is_numpy(x) else x for x in v)
    return v


def _has_nul(v: Any, depth: int = 0) -> bool:
    if isinstance(v, str):
        return "\x00" in v
    if depth > 64:  # deeper trees are refused by the YAML reader first
        return False
    if isinstance(v, dict):
        return any(_has_nul(k, depth + 1) or _has_nul(x, depth + 1) for k, x in v.items())
    if isinstance(v, list | tuple):
        return any(_has_nul(x, depth + 1) for x in v)
    return False


def increasing_fractions(v: list[float] | None, what: str) -> list[float] | None:
    if v is not None and (any(not 0.0 < x < 1.0 for x in v) or list(v) != sorted(set(v))):
        raise PydanticCustomError("fractions", f"allowed: strictly increasing fractions of the run in (0, 1) ({what})")
    return v
