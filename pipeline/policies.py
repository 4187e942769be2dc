"""The DF filter policies: one small object per kind.

Every policy comes down to a DF cap (a term is kept when its document frequency <= cap):
- ``none``: no cap;
- ``ratio``: cap = int(ratio x documents) — the reference; grows with the collection;
- ``absolute``: a fixed cap;
- ``rank``: drop the K most common candidate terms: cap = DF of the K-th most common - 1
  (terms tied with it go too). A term found in a single document is never dropped.

Each kind names its one parameter (the field of the same name in ``EnrichSettings`` and the
search profile carries it), the grid ``sira bench`` tunes it over on dev, and the CLI option
that sets it. Adding a policy: a class here, registered in ``KINDS`` (plus its parameter's
field in ``EnrichSettings`` and ``Profile`` when it has a new one).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal


@dataclass(frozen=True)
class Policy:
    kind: ClassVar[str]
    param: ClassVar[str | None] = None  # its parameter's name in settings and profiles
    grid: ClassVar[tuple] = ()  # values the bench tunes the parameter over
    option: ClassVar[tuple[str, str] | None] = None  # CLI flag and its help

    def cap(self, n_docs: int, dfs: Iterable[int]) -> int | None:
        """The largest DF a kept term may have; None means no cap."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    @property
    def value(self) -> Any:
        return getattr(self, self.param) if self.param else None

    def stored(self) -> dict[str, Any]:
        """The form kept in ``_meta`` (``sira_filter``) and in a profile."""
        return {"policy": self.kind, **({self.param: self.value} if self.param else {})}

    def needs_statistics(self) -> bool:
        """Whether the cap depends on the candidate terms' DFs (not only the collection size)."""
        return False


@dataclass(frozen=True)
class NoCap(Policy):
    kind: ClassVar[str] = "none"

    def cap(self, n_docs: int, dfs: Iterable[int]) -> int | None:
        return None

    def describe(self) -> str:
        return "none"


@dataclass(frozen=True)
class Ratio(Policy):
    ratio: float = 0.05
    kind: ClassVar[str] = "ratio"
    param: ClassVar[str] = "ratio"
    grid: ClassVar[tuple] = (0.001, 0.0025, 0.005, 0.01, 0.05)
    option: ClassVar[tuple[str, str]] = ("--ratio", "ratio: drop DF > ratio x documents.")

    def cap(self, n_docs: int, dfs: Iterable[int]) -> int | None:
        return int(n_docs * self.ratio)

    def describe(self) -> str:
        return f"ratio {self.ratio:g}"


@dataclass(frozen=True)
class Absolute(Policy):
    absolute_cap: int = 50
    kind: ClassVar[str] = "absolute"
    param: ClassVar[str] = "absolute_cap"
    grid: ClassVar[tuple] = (5, 10, 20, 50, 100)
    option: ClassVar[tuple[str, str]] = ("--cap", "absolute: drop DF > cap.")

    def cap(self, n_docs: int, dfs: Iterable[int]) -> int | None:
        return self.absolute_cap

    def describe(self) -> str:
        return f"absolute {self.absolute_cap}"


@dataclass(frozen=True)
class Rank(Policy):
    rank_k: int = 50
    kind: ClassVar[str] = "rank"
    param: ClassVar[str] = "rank_k"
    grid: ClassVar[tuple] = (0, 10, 25, 50, 100, 200, 400)
    option: ClassVar[tuple[str, str]] = ("--k", "rank: drop the K most common terms.")

    def cap(self, n_docs: int, dfs: Iterable[int]) -> int | None:
        if self.rank_k == 0:
            return None
        ranked = sorted(dfs, reverse=True)
        if not ranked:
            return None
        kth = ranked[min(self.rank_k, len(ranked)) - 1]
        return max(kth - 1, 1)

    def describe(self) -> str:
        return f"rank K={self.rank_k}"

    def needs_statistics(self) -> bool:
        return True


KINDS: dict[str, type[Policy]] = {cls.kind: cls for cls in (NoCap, Ratio, Absolute, Rank)}
PolicyKind = Literal["none", "ratio", "absolute", "rank"]
DEFAULT_KIND: PolicyKind = "rank"


def make(kind: str, **params: Any) -> Policy:
    """The policy ``kind`` with its parameter taken from ``params`` (others ignored)."""
    cls = KINDS[kind]
    if cls.param and params.get(cls.param) is not None:
        return cls(params[cls.param])
    return cls()


def from_values(values: dict[str, Any]) -> Policy:
    """The policy a settings section, a profile or a stored ``sira_filter`` names."""
    return make(values.get("policy") or DEFAULT_KIND, **values)


def keeps(df: int, cap: int | None) -> bool:
    return cap is None or df <= cap
