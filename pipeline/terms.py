"""Proposed terms: normalised through the enrichment fields' analyzer (so index and query
agree),
de-duplicated, decomposed into n-grams, and classified as echo (shares an analysed token with
its document) or bridge (shares none)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from pipeline.engine import Engine
from pipeline.schema import ECHO_FIELD

# the enrichment field's analyzer: sira_english in the own layout; in an attached index the
# analyzer of its first source field (pipeline.attach)
ANALYZED_AS = ECHO_FIELD
WORD = re.compile(r"\w+(?:['’-]\w+)*")
CLASSIFY_CHARS = 50_000  # how much of a long document is compared against its terms
ECHO, BRIDGE = "echo", "bridge"


@dataclass(frozen=True)
class Term:
    text: str  # as proposed, trimmed
    norm: str  # the analyser's tokens joined by spaces: the key for DF and de-duplication
    kind: str  # ECHO or BRIDGE

    def as_json(self) -> dict:
        return {"text": self.text, "norm": self.norm, "class": self.kind}


def words(phrase: str) -> list[str]:
    return WORD.findall(phrase)


def ngrams(tokens: list[str], max_n: int) -> list[str]:
    """Every contiguous run of 1..max_n tokens, longest first."""
    return [" ".join(tokens[i:i + n]) for n in range(min(max_n, len(tokens)), 0, -1)
            for i in range(len(tokens) - n + 1)]


def normalize(engine: Engine, index: str, phrases: list[str]) -> list[str]:
    """The analysed form of each phrase ('' when nothing survives analysis)."""
    return [" ".join(tokens) for tokens in engine.analyze(index, phrases, field=ANALYZED_AS)]


def analysis_key(engine: Engine, index: str) -> str:
    """What ``prepare`` depends on besides the proposals and their document: the engine and
    its version, the analyzer of the enrichment field and the index's analysis settings.
    Terms prepared under the same key are what ``prepare`` would compute again."""
    field: dict = {"properties": engine.get_mapping(index)["properties"]}
    for part in ANALYZED_AS.split("."):  # sira.echo: properties.sira.properties.echo
        field = field["properties"][part]
    analysis = engine.index_settings(index).get("index", {}).get("analysis", {})
    basis = [engine.kind, engine.version, field.get("analyzer", "standard"), analysis]
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:32]


def prepare(engine: Engine, index: str, proposals: dict[str, list[str]],
            documents: dict[str, str]) -> dict[str, list[Term]]:
    """Normalise, de-duplicate and classify the proposals of many documents with two batched
    ``_analyze`` passes (phrases, then documents)."""
    flat = [(doc_id, phrase.strip()) for doc_id, phrases in proposals.items()
            for phrase in phrases if phrase and phrase.strip()]
    norms = normalize(engine, index, [phrase for _, phrase in flat])
    ids = list(proposals)
    doc_tokens = dict(zip(ids, engine.analyze(
        index, [documents.get(i, "")[:CLASSIFY_CHARS] for i in ids], field=ANALYZED_AS),
        strict=True))
    out: dict[str, list[Term]] = {doc_id: [] for doc_id in ids}
    seen: dict[str, set[str]] = {doc_id: set() for doc_id in ids}
    for (doc_id, phrase), norm in zip(flat, norms, strict=True):
        if not norm or norm in seen[doc_id]:
            continue
        seen[doc_id].add(norm)
        kind = ECHO if set(norm.split()) & set(doc_tokens[doc_id]) else BRIDGE
        out[doc_id].append(Term(phrase, norm, kind))
    return out
