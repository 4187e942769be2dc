"""The index layout, in one place: the fields sira writes (all under one object, ``sira``),
where a document's text is read and searched (``Layout``: the project's own layout, or the
fields of a user's index that ``sira attach`` recorded), and the lifecycle of a document's
``sira.status``.

    pending ──(a job marks it)──> queued ──(the model answered, stored)──> proposed
        │                            │                                        │
        │                            └──(model or engine failure)──> failed   │
        └──────── `sira enrich` / `sira follow` send pending ones ──────────> │
                                                          apply (DF filter) ──> enriched

A document an application wrote has no ``sira`` object at all: it counts as pending. A
``failed`` document is sent again by later jobs until ``SIRA_WORKER__MAX_DOC_ATTEMPTS``; a
``proposed`` or ``enriched`` one only when its text (the hash of the layout's fields) or the
prompt changed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

PENDING, QUEUED, PROPOSED, ENRICHED, FAILED = "pending", "queued", "proposed", "enriched", "failed"
PROPOSED_STATES = (PROPOSED, ENRICHED)  # proposals stored for the current content

SIRA = "sira"  # the one object that holds everything sira writes into a document
ECHO_FIELD, BRIDGE_FIELD = "sira.echo", "sira.bridge"  # the filtered enrichment per class
PROPOSED_TERMS = "sira.proposed_terms"  # normalised proposals (keyword), for aggregations
PROPOSALS = "sira.proposals"  # the raw and normalised proposals (stored, not indexed)
PROPOSED_HASH = "sira.proposed_hash"  # the text hash the proposals were made for

# the project's own layout (the sample, the bench, `sira index`)
TEXT_FIELD = "contents"  # title + text of a document as one field (copy_to)
ENRICHED_FIELD = "enriched"  # title + text + both enrichment classes as one field (copy_to)
OWN_TEMPLATE = "sira-two-clause"

ATTACH_META = "sira_attach"  # in an attached index's _meta: what `sira attach` recorded
# in an own-layout index's _meta: the fields that index two-word phrases as terms
# (IndexSettings.phrase_terms: index_phrases); ``true`` in an index made before the text
# field had them too: the enriched field alone
PHRASE_TERMS_META = "sira_phrase_terms"


@dataclass(frozen=True)
class Layout:
    """Where an index keeps a document's text. ``fields``: what the model reads and what the
    change hash covers (several: the first plays the title); ``text_fields``: the text as it
    is searched; ``enriched_field``: one field with the text and both enrichment classes,
    where the layout has one (the own layout, by copy_to); ``pair_fields``: the fields that
    index two-word phrases as terms, so DF counts take them from the term dictionary."""

    fields: tuple[str, ...] = ("title", "text")
    text_fields: tuple[str, ...] = (TEXT_FIELD,)
    enriched_field: str | None = ENRICHED_FIELD
    template_id: str = OWN_TEMPLATE
    attached: bool = False
    pair_fields: tuple[str, ...] = ()

    @classmethod
    def of(cls, meta: dict) -> Layout:
        """The layout of an index, given its ``_meta``."""
        attached = meta.get(ATTACH_META)
        if not attached:
            pairs = meta.get(PHRASE_TERMS_META)
            if not pairs:
                return OWN
            return cls(pair_fields=(ENRICHED_FIELD,) if pairs is True else tuple(pairs))
        fields = tuple(attached["fields"])
        return cls(fields, fields, None, attached["template"], True)

    def title_text(self, source: dict) -> tuple[str, str]:
        """The document as the model reads it: (title, text)."""
        values = [text_of(field_value(source, f)) for f in self.fields]
        if len(values) == 1:
            return "", values[0]
        return values[0], "\n\n".join(v for v in values[1:] if v)

    def content_hash(self, source: dict) -> str:
        title, text = self.title_text(source)
        return content_hash(title, text)

    def read(self) -> list[str]:
        """The ``_source`` a step needs of each document: its text and sira's object."""
        return [*self.fields, SIRA]

    def literal_fields(self, classes: str) -> list[str]:
        """Scored fields of the literal clause: the enrichment of the chosen classes, then the
        text."""
        enrich = {"both": [ECHO_FIELD, BRIDGE_FIELD], "echo": [ECHO_FIELD],
                  "bridge": [BRIDGE_FIELD], "none": []}[classes]
        return [*enrich, *self.text_fields]

    def expansion_fields(self, classes: str) -> list[str]:
        """Where the sketch is scored: with both classes, the one field that holds text and
        enrichment together where the layout has it (a third of the term lookups, the same
        quality measured: README, Results); otherwise the literal clause's fields."""
        if classes == "both" and self.enriched_field:
            return [self.enriched_field]
        return self.literal_fields(classes)

    def phrase_fields(self, enriched: bool) -> list[str]:
        """Where a phrase's DF is counted: the text, or the text and the enrichment."""
        if not enriched:
            return list(self.text_fields)
        return [self.enriched_field] if self.enriched_field else self.literal_fields("both")


OWN = Layout()


def content_hash(title: str, text: str) -> str:
    return hashlib.sha256(f"{title}\n{text}".encode()).hexdigest()


def field_mapping(mapping: dict, path: str) -> dict | None:
    """The mapping of a field by its dotted path: object properties and multi-fields."""
    node: dict = {"properties": mapping.get("properties", {})}
    for part in path.split("."):
        children = {**(node.get("fields") or {}), **(node.get("properties") or {})}
        if part not in children:
            return None
        node = children[part]
    return node


def source_document(mapping: dict, fields: list[str], value: str) -> dict:
    """A ``_source`` that gives each field (dotted path) ``value``: set on its object path, a
    multi-field's on its parent, a copy_to target's on itself."""
    document: dict = {}
    for path in fields:
        node, keys = mapping, []
        for part in path.split("."):
            if part in (node.get("fields") or {}):
                break  # a multi-field: indexed from its parent's value
            keys.append(part)
            node = (node.get("properties") or {}).get(part) or {}
        target = document
        for key in keys[:-1]:
            target = target.setdefault(key, {})
        target[keys[-1]] = value
    return document


def field_value(source: dict, path: str) -> Any:
    """A field of ``_source`` by its dotted path, in nested objects or as a flat key."""
    if path in source:
        return source[path]
    node: Any = source
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def text_of(value: Any) -> str:
    """A field value as text: arrays joined by newlines, absent as ''."""
    if value is None:
        return ""
    if isinstance(value, list):
        return "\n".join(text_of(v) for v in value if v is not None)
    return str(value)


def sira_of(source: dict) -> dict:
    """A document's ``sira`` object ({} for a document sira has not written to)."""
    value = source.get(SIRA)
    return value if isinstance(value, dict) else {}
