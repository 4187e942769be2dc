"""Query side: optional expected-answer sketch from the model, DF validation against the
enriched index, and one weighted two-clause BM25 query:

    score(d) = BM25(q_orig, d) + w * BM25(q_exp, d)

q_orig over ``contents`` (title + text) and the enrichment fields of the chosen classes, q_exp
over ``enriched`` (the same text in one field) when both classes take part. q_exp is sent as
the analysed terms of the kept sketch phrases, one boosted ``term`` clause per distinct term
(its boost w times its count): the same scores as one ``match`` per phrase, for less work per
search — validation has analysed the phrases already. The same query is stored in the engine
as a search template (``mappings/search-template.mustache``) for Kibana / OpenSearch
Dashboards users, who may pass sketch phrases instead (the engine analyses them);
``build_query`` here produces what it renders.

Caller phrasings (``also``): several query strings for one search, each ranked by the same
query, fused by reciprocal rank with equal weight.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

from pipeline import dfstats, policies, terms
from pipeline.config import Settings
from pipeline.engine import Engine, mappings_dir
from pipeline.llm import ModelClient
from pipeline.profile import DEFAULT_W, Classes, Profile
from pipeline.prompts import query_prompt
from pipeline.schema import BRIDGE_FIELD, ECHO_FIELD, OWN, Layout

TEMPLATE_ID = OWN.template_id  # the own layout's; an attached index has its own (Layout)
RRF_K = 60
LEAF = re.compile(r"weight\(([^:\s(]+):(.+?) in \d+\)")
# validation sends its _analyze from here while the counts go out (both clients are thread-safe)
_BESIDE = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sira-validation")


def fields_for(classes: Classes, layout: Layout = OWN) -> list[str]:
    """Scored fields of the literal clause: the enrichment of the chosen classes, then the
    text."""
    return layout.literal_fields(classes)


def expansion_fields(classes: Classes, layout: Layout = OWN) -> list[str]:
    """Where the sketch is scored (``Layout.expansion_fields``)."""
    return layout.expansion_fields(classes)


def build_query(text: str, expansion: Mapping[str, int] | None = None, *,
                w: float = DEFAULT_W, size: int = 10, classes: Classes = "both",
                named: bool = False, layout: Layout = OWN, filter: dict | None = None) -> dict:
    """The search body the stored template renders for the same parameters. ``expansion``:
    analysed sketch term -> count (``expansion_terms``). With w = 0 the expansion clauses are
    left out, so the ranking is exactly the literal query's. ``named``: name every clause
    (``literal``, ``expansion:<term>``) so that each hit says which matched — the engine then
    runs the named clauses again for every hit, so only ``--explain`` asks for it.
    ``filter``: a query the hits must match, not scored (a user's own filter)."""
    literal = {"query": text, "type": "most_fields", "fields": fields_for(classes, layout)}
    should: list[dict] = [{"multi_match": {**({"_name": "literal"} if named else {}), **literal}}]
    for term in _term_params(expansion or {}, w, classes, layout) if w else []:
        clause = {"value": term["value"], "boost": term["boost"]}
        should.append({"term": {term["field"]: {**({"_name": term["name"]} if named else {}),
                                                **clause}}})
    should.append({"match_none": {}})
    query: dict = {"should": should}
    if filter:
        query = {"filter": filter, **query, "minimum_should_match": 1}
    return {"size": size, "query": {"bool": query}}


def _term_params(expansion: Mapping[str, int], w: float, classes: Classes,
                 layout: Layout = OWN) -> list[dict]:
    fields = expansion_fields(classes, layout)
    return [{"field": f, "value": term, "boost": w * count,
             "name": f"expansion:{term}" + (f"@{f}" if len(fields) > 1 else "")}
            for f in fields for term, count in expansion.items()]


def expansion_terms(norms: Sequence[str]) -> dict[str, int]:
    """Analysed term -> how often it occurs over the analysed phrases: a term in two phrases
    counts twice, as it would in one ``match`` clause per phrase."""
    return dict(Counter(token for norm in norms for token in norm.split()))


def template_params(text: str, expansion: Mapping[str, int] | None = None, *,
                    w: float = DEFAULT_W,
                    size: int = 10, classes: Classes = "both", named: bool = False,
                    phrases: Sequence[str] = (), layout: Layout = OWN,
                    filter: dict | None = None) -> dict:
    """Parameters of the stored template: ``expansion`` as ``build_query`` takes it, or
    ``phrases`` as a person types them (the engine analyses each, one clause per phrase).
    ``filter``: one query object the hits must match."""
    params: dict = {"query": text, "expansion": list(phrases), "w": w, "size": size,
                    "terms": _term_params(expansion or {}, w, classes, layout) if w else []}
    if named:
        params["named"] = True
    if filter:
        params["filter"] = filter
    if classes in ("echo", "none"):
        params["skip_bridge"] = True
    if classes in ("bridge", "none"):
        params["skip_echo"] = True
    return params


def template_source(layout: Layout = OWN) -> str:
    """The two-clause template (``mappings/search-template.mustache``) for a layout's fields."""
    def listed(fields: Sequence[str]) -> str:
        return ", ".join(json.dumps(f) for f in fields)

    source = mappings_dir().joinpath("search-template.mustache").read_text("utf-8")
    return (source.replace("@TEXT_FIELDS@", listed(layout.text_fields))
            .replace("@BOTH_FIELDS@", listed(layout.expansion_fields("both")))
            .replace("@ECHO@", json.dumps(ECHO_FIELD))
            .replace("@BRIDGE@", json.dumps(BRIDGE_FIELD)))


def install_template(engine: Engine, layout: Layout = OWN) -> str:
    engine.put_search_template(layout.template_id, template_source(layout))
    return layout.template_id


# -- results -------------------------------------------------------------------------------


@dataclass
class Hit:
    id: str
    score: float
    title: str
    text: str
    matched_queries: list[str] = field(default_factory=list)
    matched_terms: dict[str, list[str]] = field(default_factory=dict)  # field -> terms


@dataclass
class DroppedTerm:
    term: str
    reason: str


@dataclass
class SearchResult:
    query: str
    hits: list[Hit]
    took_ms: int
    total: int
    also: list[str] = field(default_factory=list)
    sketch: list[str] | None = None  # what the model proposed, before validation
    expansion: list[str] = field(default_factory=list)  # the phrases that took part
    dropped: list[DroppedTerm] = field(default_factory=list)
    expansion_note: str | None = None  # why there is no expansion, if there is none
    cap: int | None = None
    model_ms: int | None = None
    profile: dict = field(default_factory=dict)  # the values this search used, and whence


# -- validation ----------------------------------------------------------------------------


def active_cap(engine: Engine, index: str, meta: dict, profile: Profile) -> int | None:
    """The DF cap ``sira enrich``/``refilter`` last applied (in the index's ``_meta``), else
    the profile's (the rank policy needs the collection's statistics, so it then means no
    cap)."""
    applied = meta.get("sira_filter")
    if applied:
        return applied.get("cap")
    policy = profile.filter_policy()
    if policy.needs_statistics():
        return None
    return policy.cap(engine.count(index), [])


class Validation(NamedTuple):
    kept: list[str]  # sketch phrases that take part, in the sketch's order
    dropped: list[DroppedTerm]
    terms: dict[str, int]  # what is searched: the kept phrases' analysed terms (expansion_terms)


def validate(engine: Engine, index: str, phrases: Sequence[str], cap: int | None, max_n: int,
             fields: Sequence[str] = tuple(dfstats.ENRICHED_FIELDS),
             max_sketch_terms: int | None = None, *, pair_fields: Collection[str] = ()
             ) -> Validation:
    """Keep a phrase when some 1..max_n-word part of it has 0 < DF <= cap in ``fields``
    (default: the enriched index), each part counted as far as the decision needs
    (``dfstats.bounded_frequencies``): its words first, then only the longer parts of the
    phrases no word of which decides (``part_frequencies``).
    ``max_sketch_terms``: at most this many distinct analysed terms take part — whole phrases
    in the sketch's order, a phrase that would go over is dropped (each term is one clause
    of the search, and clauses are what it costs; RM3's "expansion terms" in effect).
    ``pair_fields``: the fields that index two-word phrases as terms (``Layout``)."""
    return validate_many(engine, index, {"": phrases}, cap, max_n, fields,
                         max_sketch_terms, pair_fields=pair_fields)[""]


def _qualifies(df: int, cap: int | None) -> bool:
    return 0 < df and policies.keeps(df, cap)


def part_frequencies(engine: Engine, index: str, parts: Mapping[str, Sequence[str]],
                     cap: int | None, fields: Sequence[str], *,
                     pair_fields: Collection[str] = (),
                     analysed: Callable[[], Mapping[str, str]] | None = None,
                     read: Mapping[str, int] | None = None) -> dict[str, int]:
    """min(DF, cap + 1) of the parts (lower-cased) a decision on each phrase needs, ``parts``
    being each phrase's 1..max_n-word parts. A phrase of common words is found by walking
    its words' postings, a cost that grows with the collection, while one word is counted
    from the term dictionary; and a phrase is kept as soon as one part qualifies. So the
    words (and two-word parts where ``pair_fields`` index them as terms) are counted first,
    in one ``_msearch``, and the longer parts only for the phrases none of whose words
    qualifies, in a second one, with the words the analyzer splits (``x-ray``, ``IL-6``: a
    phrase of their pieces). ``analysed``: each word's analysed form in the one field
    counted, where the caller has it; a part with a word found in no document is then in
    none and is not counted (a stopword alone counts 0 too, but bounds nothing). ``read``:
    the DFs of words (lower-cased) the caller read from the term dictionary
    (``dfstats.dictionary_tokens``): not counted again. A part left out belongs only to
    phrases already kept."""
    bound = 1 if cap is None else cap + 1
    pairs = len(fields) == 1 and fields[0] in pair_fields
    every = {p.lower(): p for ps in parts.values() for p in ps}
    known = {key: min(df, bound) for key, df in (read or {}).items() if key in every}
    first = {key: part for key, part in every.items() if dfstats.dictionary_words(part)
             and len(part.split()) <= (2 if pairs else 1) and key not in known}
    df = known | dfstats.bounded_frequencies(engine, index, first, bound, list(fields),
                                             pair_fields=pair_fields)
    undecided = [ps for ps in parts.values()
                 if not any(_qualifies(df[p.lower()], cap) for p in ps if p.lower() in df)]
    absent = {w.lower() for w, norm in (analysed() if analysed else {}).items()
              if norm and df.get(w.lower()) == 0}
    needed: dict[str, str] = {}
    for part in (p for ps in undecided for p in ps):
        key = part.lower()
        if key in df or key in needed:
            continue
        if absent & set(key.split()):
            df[key] = 0
        else:
            needed[key] = part
    if needed:
        df |= dfstats.bounded_frequencies(engine, index, needed, bound, list(fields),
                                          pair_fields=pair_fields)
    return df


def validate_many(engine: Engine, index: str, sketches: dict[str, Sequence[str]],
                  cap: int | None, max_n: int,
                  fields: Sequence[str] = tuple(dfstats.ENRICHED_FIELDS),
                  max_sketch_terms: int | None = None, *, pair_fields: Collection[str] = ()
                  ) -> dict[str, Validation]:
    """``validate`` for many sketches at once (the bench: every query of a collection), with
    one batched ``_analyze`` and one DF lookup (``part_frequencies``) for the parts of all of
    them, the ``_analyze`` sent beside the counts (neither needs the other's answer)."""
    flat = [(key, phrase) for key, phrases in sketches.items() for phrase in phrases]
    parts = {phrase: terms.ngrams(terms.words(phrase), max_n) for _, phrase in flat}
    # the own layout's enriched field is analysed as sira's enrichment fields (ANALYZED_AS),
    # so the same _analyze tells which of the words are stopwords there
    words = sorted({w for ps in parts.values() for p in ps for w in p.split()})
    own = list(fields) == dfstats.ENRICHED_FIELDS
    texts = [phrase for _, phrase in flat] + (words if own else [])
    # where the term dictionary counts exactly, one read of it analyses and counts the words
    read = dfstats.dictionary_tokens(engine, index, fields[0], texts) \
        if own and not pair_fields else None
    if read is not None:
        norms = [" ".join(term for term, _ in tokens) for tokens in read[:len(flat)]]
        by_word = dict(zip(words, read[len(flat):], strict=True))
        df = part_frequencies(
            engine, index, parts, cap, fields,
            analysed=lambda: {w: " ".join(t for t, _ in tokens) for w, tokens in by_word.items()},
            read={w.lower(): tokens[0][1] if tokens else 0 for w, tokens in by_word.items()
                  if len(tokens) <= 1 and dfstats.dictionary_words(w)})
    else:
        analysed = _BESIDE.submit(terms.normalize, engine, index, texts)
        df = part_frequencies(engine, index, parts, cap, fields, pair_fields=pair_fields,
                              analysed=(lambda: dict(zip(words, analysed.result()[len(flat):],
                                                         strict=True))) if own else None)
        norms = analysed.result()[:len(flat)]
    unique: dict[str, dict[str, str]] = {key: {} for key in sketches}  # phrase -> analysed
    out = {key: Validation([], [], {}) for key in sketches}
    seen: dict[str, set[str]] = {key: set() for key in sketches}
    for (key, phrase), norm in zip(flat, norms, strict=True):
        dropped = out[key].dropped
        if not norm:
            dropped.append(DroppedTerm(phrase, "nothing left after analysis (stopwords only)"))
        elif norm in seen[key]:
            dropped.append(DroppedTerm(phrase, "duplicate"))
        else:
            seen[key].add(norm)
            unique[key][phrase] = norm
    for key, phrases in unique.items():
        kept, dropped, searched = out[key]
        taken: set[str] = set()
        for phrase in phrases:
            # a part not counted belongs to a phrase a counted word keeps (part_frequencies)
            dfs = [df[p.lower()] for p in parts[phrase] if p.lower() in df]
            if any(_qualifies(d, cap) for d in dfs):
                tokens = set(phrases[phrase].split())
                if max_sketch_terms is not None and len(taken | tokens) > max_sketch_terms:
                    dropped.append(DroppedTerm(
                        phrase, f"over the budget of {max_sketch_terms} sketch terms"))
                    continue
                kept.append(phrase)
                taken |= tokens
            elif all(d == 0 for d in dfs):
                dropped.append(DroppedTerm(phrase, "not in the index (DF 0)"))
            else:
                dropped.append(DroppedTerm(phrase, f"too common (DF > cap {cap})"))
        searched.update(expansion_terms([phrases[phrase] for phrase in kept]))
    return out


# -- search --------------------------------------------------------------------------------


def _hits(response: dict, layout: Layout = OWN) -> list[Hit]:
    return [Hit(h["_id"], float(h["_score"] or 0.0), *layout.title_text(h.get("_source", {})),
                sorted(h.get("matched_queries", []), key=lambda n: (n != "literal", n)),
                _matched_terms(h.get("_explanation")))
            for h in response["hits"]["hits"]]


def _matched_terms(explanation: dict | None) -> dict[str, list[str]]:
    """field -> analysed terms that scored, from the engine's explanation tree."""
    found: dict[str, list[str]] = {}

    def walk(node: dict) -> None:
        match = LEAF.match(node.get("description", ""))
        if match and node.get("value", 0) > 0:
            bucket = found.setdefault(match.group(1), [])
            if match.group(2) not in bucket:
                bucket.append(match.group(2))
            return
        for child in node.get("details", []):
            walk(child)

    if explanation:
        walk(explanation)
    return found


def rrf(rankings: list[list[Hit]], size: int, k: int = RRF_K) -> list[Hit]:
    """Reciprocal rank fusion, every ranking weighted the same."""
    fused: dict[str, float] = {}
    first: dict[str, Hit] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            fused[hit.id] = fused.get(hit.id, 0.0) + 1.0 / (k + rank)
            first.setdefault(hit.id, hit)
    order = sorted(fused, key=lambda d: (-fused[d], d))[:size]
    return [Hit(**{**first[d].__dict__, "score": fused[d]}) for d in order]


def combine(rankings: list[list[Hit]], size: int) -> list[Hit]:
    """The ranking of one search from the rankings of its requests (``search_bodies``): one
    as it is, several fused by ``rrf``. A rerank stage belongs here: ``sira search`` and the
    bench both call it."""
    return rankings[0][:size] if len(rankings) == 1 else rrf(rankings, size)


def search_bodies(text: str, searched: Mapping[str, int], also: Sequence[str] = (), *,
                  w: float, classes: Classes, size: int, explain: bool = False,
                  source: Sequence[str] | bool | None = None, layout: Layout = OWN,
                  filter: dict | None = None) -> list[dict]:
    """The requests of one search (``search`` and the bench send the same): the two-clause
    query of ``text`` with the validated sketch's terms, then the literal query of each other
    phrasing; several rankings are fused with ``rrf``. ``source``: what each hit returns
    (default: the layout's text fields)."""
    shape = {"classes": classes, "size": size, "named": explain, "layout": layout,
             "filter": filter}
    bodies = [build_query(text, searched, w=w, **shape)]
    bodies += [build_query(a, **shape) for a in also]
    source = list(layout.fields) if source is None else source
    for body in bodies:
        body["_source"] = list(source) if not isinstance(source, bool) else source
        body["explain"] = explain
    return bodies


def search(
    engine: Engine,
    settings: Settings,
    text: str,
    *,
    also: Sequence[str] = (),
    expand: bool = False,
    expansion: Sequence[str] | None = None,
    client: ModelClient | None = None,
    profile: Profile | None = None,
    w: float | None = None,
    max_n: int | None = None,
    classes: Classes | None = None,
    max_sketch_terms: int | None = None,
    size: int = 10,
    explain: bool = False,
    filter: dict | None = None,
) -> SearchResult:
    """Search the enriched index. ``expand``: ask the model for a sketch; ``expansion``:
    sketch terms given by the caller (e.g. recorded); either way they are validated against
    the index first. ``also``: more phrasings of the same need, fused with equal weight.
    ``profile``: the ranking parameters (default: the one stored with the index, see
    ``pipeline.profile``); ``w``, ``max_n``, ``classes`` and ``max_sketch_terms`` override
    it for this search. ``filter``: a query the hits must match (not scored). The fields
    searched are the index's (``Layout``: its own layout, or those ``sira attach`` named)."""
    index = settings.index.name
    meta = engine.get_meta(index)
    layout = Layout.of(meta)
    profile = (profile or Profile.for_index(meta, settings)).overridden(
        w=w, max_n=max_n, classes=classes, max_sketch_terms=max_sketch_terms)
    result = SearchResult(text, [], 0, 0, also=list(also), profile=profile.stored())
    sketch: list[str] | None = list(expansion) if expansion is not None else None
    searched: dict[str, int] = {}
    if expand and sketch is None:
        sketch, result.model_ms, result.expansion_note = _sketch(settings, client, text)
    result.sketch = sketch
    if sketch:
        result.cap = active_cap(engine, index, meta, profile)
        result.expansion, result.dropped, searched = validate(
            engine, index, sketch, result.cap, profile.max_n, layout.phrase_fields(True),
            max_sketch_terms=profile.max_sketch_terms,
            pair_fields=layout.pair_fields)
        if not result.expansion:
            result.expansion_note = "no sketch term passed validation"
    elif expand and result.expansion_note is None:
        result.expansion_note = "the model proposed no terms"

    bodies = search_bodies(text, searched, also, w=profile.w, classes=profile.classes,
                           size=size, explain=explain, layout=layout, filter=filter)
    responses = engine.msearch(index, bodies)
    result.took_ms = sum(int(r["took"]) for r in responses)
    result.total = int(responses[0]["hits"]["total"]["value"])
    rankings = [_hits(r, layout) for r in responses]
    result.hits = combine(rankings, size)
    return result


def _sketch(settings: Settings, client: ModelClient | None, text: str
            ) -> tuple[list[str] | None, int | None, str | None]:
    """(terms, model milliseconds, note). A model that fails or times out only costs the
    expansion: the search goes on with the literal query."""
    owned = client is None
    if client is None:
        if not settings.llm.url:
            return None, None, "expansion skipped: no model server configured (SIRA_LLM__URL)"
        client = ModelClient(settings.llm.model_copy(update={
            "read_timeout": settings.llm.search_timeout, "max_attempts": 1}))
    prompt = query_prompt(settings.llm.sketch_phrases, settings.index.max_ngram)
    started = time.monotonic()
    try:
        answer = client.keywords(prompt, [("query", text)])[0]
    finally:
        if owned:  # a client made for this one search
            client.close()
    elapsed = int((time.monotonic() - started) * 1000)
    if not answer.ok:
        return None, elapsed, f"expansion skipped: {answer.reason}"
    return answer.keywords, elapsed, None
