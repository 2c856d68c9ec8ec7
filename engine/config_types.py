"""Building blocks shared by the config sections: the strict base model and the bit-width type."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict
from pydantic_core import PydanticCustomError

from engine.precision import FULL_BITS, MIN_BITS


def _bits(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_BITS <= value <= FULL_BITS:
        raise PydanticCustomError("bits", f"allowed: an integer {MIN_BITS}..{FULL_BITS}")
    return value


Bits = Annotated[int, BeforeValidator(_bits)]


class Strict(BaseModel):
    """Frozen, unknown keys forbidden, no infinite or NaN numbers: every config section derives from this."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def increasing_fractions(v: list[float] | None, what: str) -> list[float] | None:
    if v is not None and (any(not 0.0 < x < 1.0 for x in v) or list(v) != sorted(set(v))):
        raise PydanticCustomError("fractions", f"allowed: strictly increasing fractions of the run in (0, 1) ({what})")
    return v
