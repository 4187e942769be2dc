"""``sira attach``: enrichment on an index sira does not own.

Attaching adds one object, ``sira``, to the index's mapping (mappings/sira.json: the
enrichment fields, the proposals, the status) and records in its ``_meta`` which fields the
model reads (``schema.ATTACH_META``); it never changes, removes or rewrites a field the user
has, their mapping or their analyzer, and needs no index close. The enrichment fields get the
analyzer (and search analyzer) of the first source field, so a user's query is analysed the
way the enrichment was, or ``--analyzer``'s (measured: README, "Use it on your own index").
Any writer keeps writing plain documents; ``sira follow`` enriches them. ``sira detach``
removes what attach set that can be removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.engine import Engine, reason_of, sira_mapping, status_of
from pipeline.loaders import now_iso
from pipeline.schema import ATTACH_META, OWN_TEMPLATE, SIRA, Layout, field_mapping

TEXT_TYPES = {"text", "match_only_text"}
ANALYSIS_KEYS = ("analyzer", "search_analyzer", "search_quote_analyzer")


class AttachError(ValueError):
    """An index that cannot be attached as asked; the message names the index and field."""


@dataclass
class AttachResult:
    index: str
    layout: Layout
    changed: list[str] = field(default_factory=list)  # what this run set
    notes: list[str] = field(default_factory=list)


def _kind(node: dict) -> str:
    return node.get("type", "object")  # an object mapping names no type


def wanted_mapping(mapping: dict, fields: list[str], analyzer: str | None = None) -> dict:
    """The ``sira`` object for an index whose model text is ``fields``; its enrichment
    fields are analysed as the first of them is, or with ``analyzer``."""
    if analyzer:
        return sira_mapping({"analyzer": analyzer})
    first = field_mapping(mapping, fields[0]) or {}
    return sira_mapping({k: first[k] for k in ANALYSIS_KEYS if k in first})


def chosen_analyzer(mapping: dict, analyzer: str | None) -> str | None:
    """The enrichment analyzer asked for now, else the one recorded by an earlier attach."""
    recorded = ((mapping.get("_meta") or {}).get(ATTACH_META) or {})
    return analyzer or recorded.get("enrichment_analyzer")


def conflicts(have: dict, want: dict, path: str = SIRA) -> list[str]:
    """Where an existing mapping differs from the one sira would add (what sira adds must be
    there exactly; more fields under the object are left alone)."""
    found: list[str] = []
    if _kind(have) != _kind(want):
        return [f"{path} is {_kind(have)}, sira needs {_kind(want)}"]
    for key in ("enabled", *ANALYSIS_KEYS):
        if have.get(key, _default(key)) != want.get(key, _default(key)):
            found.append(f"{path} has {key} {have.get(key, _default(key))!r}, sira needs "
                         f"{want.get(key, _default(key))!r}")
    for name, child in (want.get("properties") or {}).items():
        if name in (have.get("properties") or {}):
            found += conflicts(have["properties"][name], child, f"{path}.{name}")
    return found


def _default(key: str) -> Any:
    return True if key == "enabled" else None


def check(engine: Engine, index: str, fields: list[str], analyzer: str | None = None
          ) -> tuple[dict, dict]:
    """(the index's mapping, the sira object to add), or an AttachError naming the problem.
    ``analyzer``: one for the enrichment fields (built in, or defined in the index)."""
    if not fields or any(not f.strip() for f in fields):
        raise AttachError("--fields: name at least one text field, e.g. --fields title,body")
    if not engine.index_exists(index):
        raise AttachError(f"{index}: no such index")
    mapping = engine.get_mapping(index)
    for name in fields:
        if name == SIRA or name.startswith(f"{SIRA}."):
            raise AttachError(f"{index}: {name} is sira's own field, not a source field")
        node = field_mapping(mapping, name)
        if node is None:
            raise AttachError(f"{index}: no field {name} in its mapping (attach names mapped "
                              "text fields; write a document first for a dynamic one)")
        if _kind(node) not in TEXT_TYPES:
            raise AttachError(f"{index}: field {name} is {_kind(node)}, not text: the model "
                              "reads text fields")
    analyzer = chosen_analyzer(mapping, analyzer)
    if analyzer:
        try:
            engine.analyze(index, ["check"], analyzer=analyzer)
        except Exception as exc:  # the engine answers 400 for an analyzer it does not know
            if status_of(exc) != 400:
                raise
            raise AttachError(f"{index}: --analyzer {analyzer}: not an analyzer this index "
                              f"knows ({reason_of(exc)[:200]})") from exc
    want = wanted_mapping(mapping, fields, analyzer)
    have = (mapping.get("properties") or {}).get(SIRA)
    if have is not None:
        problems = conflicts(have, want)
        if problems:
            raise AttachError(f"{index}: already has a field {SIRA} of another shape "
                              f"({'; '.join(problems[:3])}); sira keeps what it writes under "
                              f"that name: reindex into a new index to attach")
    return mapping, want


def attach(engine: Engine, index: str, fields: list[str], *, prompt_version: str,
           policy: dict, template: bool = True, analyzer: str | None = None) -> AttachResult:
    """Attach sira to ``index`` (idempotent). Nothing is written before every check passed.
    ``analyzer``: the enrichment fields' analyzer instead of the first source field's."""
    mapping, want = check(engine, index, fields, analyzer)
    analyzer = chosen_analyzer(mapping, analyzer)
    have = (mapping.get("properties") or {}).get(SIRA)
    meta = dict(mapping.get("_meta") or {})
    recorded = meta.get(ATTACH_META) or {}
    template_id = f"{OWN_TEMPLATE}-{index}"
    first = field_mapping(mapping, fields[0]) or {}
    config = {"fields": list(fields), "template": template_id,
              "analyzer": analyzer or first.get("analyzer") or "(the index default)",
              **({"enrichment_analyzer": analyzer} if analyzer else {}),
              "prompt_version": prompt_version, "policy": policy,
              "attached_at": recorded.get("attached_at") or now_iso()}
    layout = Layout.of({ATTACH_META: config})
    result = AttachResult(index, layout)
    if have is None or conflicts(have, want) or _missing(have, want):
        engine.put_mapping(index, {SIRA: want})
        result.changed.append(f"added the {SIRA} object to the mapping")
    if recorded.get("fields") and recorded["fields"] != list(fields):
        result.notes.append(f"source fields changed from {','.join(recorded['fields'])}: "
                            "every document's proposals are made again (by `sira follow`)")
    same = {k: v for k, v in recorded.items() if k != "attached_at"} == \
        {k: v for k, v in config.items() if k != "attached_at"}
    if not same:
        engine.put_meta(index, {ATTACH_META: config})
        result.changed.append(f"recorded the configuration in _meta.{ATTACH_META}")
    if template and engine.capabilities.search_templates:
        from pipeline.query import install_template, template_source

        if engine.get_search_template(template_id) != template_source(layout):
            install_template(engine, layout)
            result.changed.append(f"stored the search template {template_id}")
    elif template:
        result.notes.append("this engine has no mustache search templates: none stored")
    return result


def _missing(have: dict, want: dict) -> bool:
    """Whether a field sira adds is not in the existing object yet (an older version's)."""
    have_props = have.get("properties") or {}
    return any(name not in have_props or _missing(have_props[name], child)
               for name, child in (want.get("properties") or {}).items())


@dataclass
class DetachResult:
    index: str
    removed: list[str] = field(default_factory=list)
    stays: list[str] = field(default_factory=list)


def detach(engine: Engine, index: str) -> DetachResult:
    if not engine.index_exists(index):
        raise AttachError(f"{index}: no such index")
    meta = engine.get_meta(index)
    recorded = meta.get(ATTACH_META)
    if not recorded:
        raise AttachError(f"{index}: not attached (no _meta.{ATTACH_META})")
    result = DetachResult(index)
    template_id = recorded.get("template")
    if template_id and engine.capabilities.search_templates and \
            engine.get_search_template(template_id) is not None:
        engine.delete_search_template(template_id)
        result.removed.append(f"the search template {template_id}")
    keys = [k for k in meta if k.startswith("sira_")]
    engine.drop_meta(index, keys)
    result.removed.append("sira's entries in _meta (" + ", ".join(sorted(keys)) + ")")
    result.stays.append(f"the {SIRA} object in the mapping (a mapping cannot drop a field) "
                        f"and its values in the documents; searches that do not name "
                        f"{SIRA}.* fields are not affected by them, and `sira attach` "
                        "takes them up again")
    return result


# -- reindexing a user's index into a new one -----------------------------------------------

# index settings that belong to the source index itself, not to a copy of it
NOT_COPIED = {"uuid", "creation_date", "provided_name", "version", "routing", "resize",
              "blocks", "history", "verified_before_close", "lifecycle", "store", "replication",
              "creation_date_string", "hidden", "plugins", "frozen", "shrink", "downsample"}


def is_own_layout(mapping: dict) -> bool:
    """An index sira created itself (``mappings/index.json``): title and text copied into
    ``contents`` and ``enriched``."""
    props = mapping.get("properties") or {}
    return not (mapping.get("_meta") or {}).get(ATTACH_META) and \
        {"title", "text", "contents", "enriched"} <= set(props)


def source_fields(engine: Engine, source: str, fields: list[str] | None) -> list[str]:
    """The fields a copy of ``source`` is attached with: those given, else the source's own
    attached ones; an AttachError when neither names any."""
    recorded = (engine.get_meta(source).get(ATTACH_META) or {}).get("fields")
    if fields:
        return fields
    if recorded:
        return list(recorded)
    raise AttachError(f"{source}: not attached and not in sira's own layout: name the text "
                      "fields the model reads with --fields (e.g. --fields name,description)")


def create_copy(engine: Engine, source: str, target: str, fields: list[str], *,
                prompt_version: str, policy: dict) -> AttachResult:
    """Create ``target`` with ``source``'s mapping and settings (analysis, shards,
    similarity, ...; not what identifies the source) and attach it; an existing target is
    attached as it is (a resumed copy)."""
    if not engine.index_exists(target):
        check(engine, source, fields)  # the fields exist and are text, sira's object fits
        mapping = engine.get_mapping(source)
        mapping["_meta"] = {k: v for k, v in (mapping.get("_meta") or {}).items()
                            if not k.startswith("sira_")}
        index = {k: v for k, v in engine.index_settings(source).get("index", {}).items()
                 if k not in NOT_COPIED}
        engine.create(target, {"settings": {"index": index}, "mappings": mapping})
    return attach(engine, target, fields, prompt_version=prompt_version, policy=policy)
