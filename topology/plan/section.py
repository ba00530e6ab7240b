"""What each section builder returns: its part of the spec, with the arithmetic shown and any warnings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from ..spec import Derivation

T = TypeVar("T")


@dataclass(frozen=True)
class Section(Generic[T]):
    value: T
    derivations: tuple[Derivation, ...] = ()
    warnings: tuple[str, ...] = ()
