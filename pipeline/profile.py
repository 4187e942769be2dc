"""The search profile: every parameter that decides a ranking, in one object with one default.

``sira bench --save-profile FILE`` writes the values it chose on a dev split;
``sira profile apply FILE --index NAME`` stores them with the index (``_meta.sira_profile``);
``sira search``, ``sira refilter`` / ``enrich`` / ``reindex`` (the filter policy) and
``sira profile show`` read them from there. What decides a value, highest first: a command's
own flag, the profile stored with the index, the settings (``SIRA_ENRICH__POLICY`` and its
parameters), the defaults below. A bench figure is therefore a figure of what search runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline import policies
from pipeline.config import EnrichSettings, Settings
from pipeline.policies import PolicyKind

Classes = Literal["both", "echo", "bridge", "none"]
META_KEY = "sira_profile"
# chosen by `sira bench` on the dev splits of both collections with recordings (SciFact
# train qrels, Cranfield held-aside queries): w 0.7 on both, max_n 2 / 1 (README, Results)
DEFAULT_W = 0.7
DEFAULT_MAX_N = 2


class ProfileError(ValueError):
    """A profile file or a stored profile that cannot be used; the message names it."""


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    w: float = Field(default=DEFAULT_W, ge=0)  # weight of the sketch clause
    max_n: int = Field(default=DEFAULT_MAX_N, ge=1, le=3)  # longest sketch part validated
    classes: Classes = "both"  # enrichment classes that take part in the literal clause
    max_sketch_terms: int | None = Field(default=None, ge=1)  # budget of sketch terms
    policy: PolicyKind = "rank"  # the DF filter apply writes the enrichment fields with
    rank_k: int = Field(default=50, ge=0)
    ratio: float = Field(default=0.05, gt=0, le=1)
    absolute_cap: int = Field(default=50, ge=1)
    # BM25 of the index the values were chosen on; an existing index keeps its own (changing
    # them needs the index closed), so they are shown, compared and not applied
    bm25_k1: float | None = None
    bm25_b: float | None = None
    origin: str = "default"  # where the values come from (a bench run, a file, the defaults)

    @classmethod
    def from_settings(cls, enrich: EnrichSettings) -> Profile:
        return cls(policy=enrich.policy, rank_k=enrich.rank_k, ratio=enrich.ratio,
                   absolute_cap=enrich.absolute_cap,
                   origin="defaults and SIRA_ENRICH__* settings")

    @classmethod
    def for_index(cls, meta: dict, settings: Settings) -> Profile:
        """The profile in force for an index, given its ``_meta``: the stored one over the
        settings and defaults."""
        base = cls.from_settings(settings.enrich)
        stored = meta.get(META_KEY)
        if not stored:
            return base
        return base.merged(stored, origin=stored.get("origin") or "stored with the index")

    def filter_policy(self) -> policies.Policy:
        return policies.from_values(self.model_dump())

    def merged(self, values: dict[str, Any], origin: str | None = None) -> Profile:
        """This profile with ``values`` (None values ignored) taking precedence."""
        given = {k: v for k, v in values.items() if v is not None}
        if not given and origin is None:
            return self
        try:
            return Profile.model_validate({**self.model_dump(), **given,
                                           "origin": origin or self.origin})
        except ValidationError as exc:
            raise ProfileError(_first_error(exc, origin or "profile")) from exc

    def overridden(self, **flags: Any) -> Profile:
        """With a command's flags (None = not given) over the stored values."""
        given = {k: v for k, v in flags.items() if v is not None}
        if not given:
            return self
        names = ", ".join(f"--{k.replace('_', '-')}" for k in given)
        return self.merged(given, f"{self.origin}; {names} from the command line")

    def stored(self) -> dict[str, Any]:
        """The form kept in ``_meta`` and in a profile file."""
        return self.model_dump(exclude_none=True)

    def describe(self) -> str:
        policy = self.filter_policy().describe()
        budget = self.max_sketch_terms or "all"
        return (f"w {self.w:g}, max_n {self.max_n}, classes {self.classes}, sketch terms "
                f"{budget}, policy {policy} (from: {self.origin})")


def _first_error(exc: ValidationError, where: str) -> str:
    error = exc.errors()[0]
    field = ".".join(str(p) for p in error["loc"]) or "profile"
    return f"{where}: {field}: {error['msg']}"


def read_file(path: Path) -> Profile:
    """A profile file as ``sira bench --save-profile`` writes it (unknown keys refused)."""
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError as exc:
        raise ProfileError(f"{path}: no such file") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{path}: not a JSON file ({exc})") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a JSON object of profile values")
    values = data.get("profile", data)  # the bench's file wraps them with how they were chosen
    try:
        return Profile.model_validate({"origin": str(path), **values})
    except ValidationError as exc:
        raise ProfileError(_first_error(exc, str(path))) from exc


def write_file(path: Path, profile: Profile, chosen: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"profile": profile.stored(), "chosen": chosen}, indent=2)
                    + "\n", "utf-8")
