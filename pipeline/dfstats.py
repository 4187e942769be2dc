"""Document frequencies from index aggregations, and the filter policies built on them.

DF is always counted by the engine over the whole index, exactly: a ``filters`` aggregation
(one bucket per candidate, a bounded number of candidates per request) or a ``composite``
aggregation over the ``sira.proposed_terms`` keyword field. Both sum per-shard counts of whole
documents, so they are exact on any number of shards — unlike ``_termvectors`` statistics.

What a DF counts (``basis``):
- ``text``: documents whose title or text contains the phrase (a phrase query on ``contents``);
- ``proposals``: documents the phrase was proposed for (``sira.proposed_terms``);
- ``both``: documents with either — a term common in the text *or* proposed everywhere is
  common.

A decision needs less than every DF: whether a term's DF is 0, at most the cap, or over it.
``bounded_frequencies`` counts each term with a search that stops on each shard after
cap + 1 matches, or whole where the engine counts it from its term dictionary (one word, a
proposed term), so its cost does not grow with the collection as a ``filters`` aggregation's
does (it visits every match of every candidate): sketch validation uses it, for the words of
its phrases first and their longer parts only where no word decides
(``query.part_frequencies``). Where an own-layout index is one shard with no deleted copies
(a force-merged or append-only index), validation reads its words' DFs from the term
dictionary instead, with their analysis, in one ``_termvectors`` request
(``dictionary_tokens``): exact there, and one request where the counts cost one search each.
``apply`` counts in rounds, every term first with a low bound and then only the few whose
count stopped there: ``capped_frequencies`` under a cap known
beforehand (ratio, absolute), ``top_frequencies`` under the rank policy (the K-th largest
DF). Before any of that, ``word_bounds`` gives each term a range its DF lies in, from its
words' entries in the term dictionaries (read a few thousand words a request with
``_termvectors`` of an artificial document: not exact, deleted copies are in them, but never
below a word's DF, so an upper bound; a word the analyzer splits by its rarest piece) and the
documents it was proposed for: a phrase is in no more documents than its rarest word, and the
terms whose range already decides are not counted at all — most phrases under a high cap,
whose counts walk their words' postings (the cost that grows with the collection). The
common words whose dictionary count (up to twice their DF right after the proposals were
stored) keeps a range from deciding are counted first (``exact_words``). Exact DFs of every
term (``sira stats``, the bench's grid over policies) still come from the aggregations.

The filter policies built on them are in ``pipeline.policies``.
"""

from __future__ import annotations

import heapq
import threading
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import islice, pairwise

from pipeline.config import DfBasis
from pipeline.engine import Engine, status_of
from pipeline.schema import (
    ENRICHED_FIELD,
    PROPOSED_TERMS,
    TEXT_FIELD,
    field_mapping,
    source_document,
)

TEXT_FIELDS = [TEXT_FIELD]
# title, text and the enrichment in one field: a phrase is found in it exactly when it is
# found in one of them (copy_to keeps values apart), with a third of the lookups
ENRICHED_FIELDS = [ENRICHED_FIELD]
BATCH = 500  # candidates per filters aggregation request
COUNTS_BATCH = 1000  # counts per _msearch request when apply counts for a policy
FIRST_BOUND = 64  # where apply's counts start
BOUND_STEP = 8  # and how much higher top_frequencies counts the terms that reached the bound
COUNTED_PER_RANK = 4  # one-word terms counted exactly per place of the rank policy's K


def _clause(text: str, norm: str, basis: DfBasis, fields: list[str]) -> dict:
    in_text = {"multi_match": {"query": text, "type": "phrase", "fields": fields}}
    proposed = {"term": {PROPOSED_TERMS: norm}}
    if basis == "text":
        return in_text
    if basis == "proposals":
        return proposed
    return {"bool": {"should": [in_text, proposed], "minimum_should_match": 1}}


def document_frequencies(
    engine: Engine, index: str, terms: dict[str, str], basis: DfBasis = "both",
    fields: list[str] | None = None, batch: int = BATCH,
) -> dict[str, int]:
    """DF of each term ``{norm: surface text}``, one filters aggregation per ``batch``
    terms. ``fields``: where a phrase is looked for (default: title + text)."""
    fields = fields or TEXT_FIELDS
    items = list(terms.items())
    out: dict[str, int] = {}
    for start in range(0, len(items), batch):
        chunk = items[start:start + batch]
        filters = {f"t{i}": _clause(text, norm, basis, fields)
                   for i, (norm, text) in enumerate(chunk)}
        buckets = engine.aggregate(index, {"df": {"filters": {"filters": filters}}})["df"][
            "buckets"]
        for i, (norm, _) in enumerate(chunk):
            out[norm] = int(buckets[f"t{i}"]["doc_count"])
    return out


def bounded_frequencies(engine: Engine, index: str, terms: dict[str, str], bound: int,
                        fields: list[str], basis: DfBasis = "text", batch: int = 200, *,
                        pair_fields: Collection[str] = ()) -> dict[str, int]:
    """min(DF, ``bound``) of each term ``{norm: surface text}`` under ``basis`` (a phrase on
    ``fields`` for its text part), from count-only searches (``_counts``) in one ``_msearch``
    per ``batch`` of them. Exact on any number of shards: a shard that stopped at the bound
    brings the sum to at least ``bound``; where none stopped, every shard's count is whole.
    ``pair_fields``: the fields that index two-word phrases as terms (``index_phrases``)."""
    counts, _ = _bounded(engine, index, terms, bound, fields, basis, batch, pair_fields)
    return {norm: min(df, bound) for norm, df in counts.items()}


@dataclass(frozen=True)
class Bounds:
    """What the DFs of terms are known to lie within before any count of their own
    (``word_bounds``): ``range(norm, text)`` is (low, high), ``low <= DF <= high``."""

    basis: DfBasis
    n_docs: int
    # per word: at least the documents holding it in some field (a phrase of it is in
    # no more); a word absent bounds nothing
    words: dict[str, int]
    counted: dict[str, int]  # the words counted exactly: their text DF as one-word terms
    proposed: Mapping[str, int]

    def range(self, norm: str, text: str) -> tuple[int, int]:
        parts = text.split()
        text_low = self.counted.get(parts[0], 0) if len(parts) == 1 else 0
        text_high = min((self.words[w] for w in parts if w in self.words), default=self.n_docs)
        in_proposals = self.proposed.get(norm, 0) if self.basis == "both" else 0
        return max(text_low, in_proposals), min(text_high + in_proposals, self.n_docs)


def dictionary_words(text: str) -> bool:
    """Whether each word of ``text`` is ASCII letters and digits, one term of a text field's
    dictionary: what ``_counts`` counts whole, one word or (``pairs``) two."""
    return all(w.isascii() and w.isalnum() for w in text.split())


def word_bounds(engine: Engine, index: str, terms: dict[str, str], basis: DfBasis,
                fields: list[str], proposed: Mapping[str, int], n_docs: int, *,
                counted: int = 0, batch: int = COUNTS_BATCH) -> Bounds:
    """Each term's DF range under ``basis`` (``text`` or ``both``), from its words and
    ``proposed``: the documents each term was proposed for (exact: the scan of the stored
    proposals, which ``sira.proposed_terms`` always repeats).
    - Every distinct word of the terms is looked up in the term dictionary of each
      field on each shard (``index_counts``, a few thousand words a request): at least the
      documents that hold it. A phrase's documents hold all its words in one field, so its
      text DF is at most its rarest word's count (a word the analyzer splits, ``IL-6``:
      its rarest piece's), 0 where a word is in no document. Words the analysis drops
      (stopwords), reads two ways or may read differently at search time bound nothing; a
      phrase of nothing else has no bound but ``n_docs``.
    - The ``counted`` one-word terms of the largest such counts are counted exactly with a
      search each (the phrase query of their DF): their range is their DF (under ``both``,
      at least it and their proposals', at most the sum). The rank policy's floor comes
      from them; other terms' text DF is at least 0."""
    words = sorted({w for text in terms.values() for w in text.split()})
    bounded = index_counts(engine, index, words, fields)
    singles = heapq.nlargest(counted, {t for t in terms.values() if t in bounded},
                             key=bounded.__getitem__)
    # whole: a bound past the collection never stops a count
    exact, _ = _bounded(engine, index, {w: w for w in singles}, n_docs + 1, fields, "text",
                        batch, ())
    return Bounds(basis, n_docs, bounded | exact, exact, proposed)


def exact_words(engine: Engine, index: str, bounds: Bounds, terms: dict[str, str], level: int,
                fields: list[str], batch: int = COUNTS_BATCH) -> Bounds:
    """``bounds`` with the words that keep a term's range from deciding against ``level``
    counted. A term dictionary counts the deleted copies an update leaves until a merge drops
    them, and storing proposals rewrites every document just before apply: a word's count
    reads up to twice its DF, over a level its DF is under. So each word of the terms whose
    range straddles ``level`` (low under it, high at or over it) is counted with a search
    stopping at ``level``, and one under it takes its DF for its count (and, as a one-word
    term, for its range). They are the common words, a few hundred: far fewer searches than
    the phrases they decide, each stopping at the level."""
    straddling = (text for norm, text in terms.items()
                  if (span := bounds.range(norm, text))[0] < level <= span[1])
    words = {w: w for text in straddling for w in text.split()
             if w in bounds.words and w not in bounds.counted}
    counts, stopped = _bounded(engine, index, words, level, fields, "text", batch, (),
                               whole=False)
    exact = {w: count for w, count in counts.items() if w not in stopped}
    return replace(bounds, words=bounds.words | exact, counted=bounds.counted | exact)


WORDS_PER_REQUEST = 5000  # words per artificial document of index_counts


def index_counts(engine: Engine, index: str, words: list[str], fields: list[str],
                 per_request: int = WORDS_PER_REQUEST) -> dict[str, int]:
    """For each word (no whitespace) the analysis reads as one token or a row of pieces
    (``x-ray``, ``IL-6``) in each of ``fields``: the documents holding its rarest piece,
    per field, summed over the fields and shards, from the term dictionaries
    (``_termvectors`` of an artificial document of the words, one request per
    ``per_request`` words and shard). A phrase query of the word finds all its pieces in
    one field, so this is at least the word's DF in those fields; deleted copies not merged
    away yet are counted too. Tokens at the same offsets (synonyms) count together: the
    phrase finds either. Words that give no token in some field (stopwords) or pieces that
    overlap otherwise (the word kept beside its pieces: the phrase finds the pieces apart
    too), and all words where a field is no text field or its phrase queries are analysed
    otherwise than its values, are left out: they bound nothing."""
    if not words or len(engine.concrete_indices(index)) != 1:
        return {}  # an alias over several indices: their term dictionaries are not one
    mapping = engine.get_mapping(index)
    settings = engine.index_settings(index)
    if not all(_indexed_as_searched(mapping, settings, f) for f in fields):
        return {}
    shards = int(settings["index"]["number_of_shards"])
    out: dict[str, int] = {}
    for first in range(0, len(words), per_request):
        chunk = words[first:first + per_request]
        lengths, starts = _spans(chunk)
        document = source_document(mapping, fields, " ".join(chunk))
        # per word with a token, per field: the documents holding each piece, by its (start,
        # end) offsets (plain dicts, made as tokens come: a few million words at a time)
        pieces: dict[int, list[dict[tuple[int, int], int]]] = {}
        for shard in range(shards):
            statistics = engine.term_statistics(index, document, fields, shard)
            for f, field in enumerate(fields):
                for _, start, end, docs in statistics.get(field, []):
                    i = bisect_right(starts, start) - 1
                    if end > starts[i] + lengths[i]:
                        continue  # a token across words (shingles) bounds none of them
                    found = pieces.get(i) or pieces.setdefault(i, [{} for _ in fields])
                    found[f][start, end] = found[f].get((start, end), 0) + docs
        for i, per_field in pieces.items():
            if all(_in_a_row(found) for found in per_field):
                out[chunk[i]] = sum(min(found.values()) for found in per_field)
    return out


# per (engine, index): whether the last look found its term dictionary exact (one shard, no
# deleted copies) -- only then is it read instead of counting (``dictionary_tokens``) -- or
# None where it never is: several shards or indices behind the name, or no right to read
# index stats. Then it is not looked at again.
_EXACT_DICTIONARY: dict[tuple[str, str], bool | None] = {}
_LOOKING: dict[tuple[str, str], tuple[float, Future[bool]]] = {}  # the last look, and when
_LOOK_LOCK = threading.Lock()
_LOOKS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sira-dictionary")
RELOOK_S = 1.0  # while the dictionary is not exact, how often to look whether it became so


def dictionary_tokens(engine: Engine, index: str, field: str, texts: list[str]
                      ) -> list[list[tuple[str, int]]] | None:
    """Each text's tokens in ``field`` (a text field whose queries are analysed as its
    values), each with the documents holding it, read from the term dictionary in one
    ``_termvectors`` request: the analysis and the DF of every word at once, where a count
    search per word costs a request's overhead each. Only where that DF is exact: one index
    of one shard, no deleted copies in any copy of it (``Engine.deleted_copies``, looked at
    beside each read: exact but for documents deleted between the two requests). None
    otherwise: the caller counts with searches, exact everywhere. Where the last look found
    deleted copies (a live index: updates leave them until merges), the read is not sent and
    a look goes out beside the caller's counts at most every RELOOK_S seconds, to notice a
    merge."""
    key = (engine.url, index)
    exact = _EXACT_DICTIONARY.get(key, False)
    if not texts or exact is None:
        return None
    with _LOOK_LOCK:
        since, look = _LOOKING.get(key, (0.0, None))
        if look is None or look.done() and (exact or time.monotonic() - since > RELOOK_S):
            look = _LOOKS.submit(_look_at_dictionary, engine, index, key)
            _LOOKING[key] = (time.monotonic(), look)
    if not exact:
        return None
    _, starts = _spans(texts)  # one artificial document of the texts
    read = engine.term_statistics(index, {field: "\n".join(texts)}, [field], 0).get(field, [])
    if not look.result():
        return None
    out: list[list[tuple[int, str, int]]] = [[] for _ in texts]
    for term, start, _, docs in read:
        out[bisect_right(starts, start) - 1].append((start, term, docs))
    return [[(term, docs) for _, term, docs in sorted(tokens)] for tokens in out]


def _spans(texts: list[str]) -> tuple[list[int], list[int]]:
    """Each text's length and start offset once they are joined with one character between
    them, as the engine counts offsets: in UTF-16 code units."""
    lengths = [len(text.encode("utf-16-le")) // 2 for text in texts]
    starts = [0]
    for length in lengths[:-1]:
        starts.append(starts[-1] + length + 1)
    return lengths, starts


def reads_dictionary(engine: Engine, index: str) -> bool:
    """Whether validation on ``index`` reads the term dictionary (``dictionary_tokens``), as
    of the last look at it (waited for where one is under way)."""
    with _LOOK_LOCK:
        _, look = _LOOKING.get((engine.url, index), (0.0, None))
    if look is not None:
        look.result()
    return bool(_EXACT_DICTIONARY.get((engine.url, index)))


def _look_at_dictionary(engine: Engine, index: str, key: tuple[str, str]) -> bool:
    exact: bool | None = False
    try:
        deleted = engine.deleted_copies(index)
        exact = None if deleted is None else deleted == 0
    except Exception as exc:  # the caller counts, as it would without the look
        if status_of(exc) in (401, 403):
            exact = None  # may search, may not read index stats
    _EXACT_DICTIONARY[key] = exact
    return bool(exact)


def _in_a_row(pieces: Mapping[tuple[int, int], int]) -> bool:
    """Whether a word's tokens (their offsets; tokens at the same offsets are one, counted
    together) follow one another without overlapping: one reading of it, each token one the
    phrase query needs."""
    spans = sorted(pieces)
    return bool(spans) and all(end <= start for (_, end), (start, _) in pairwise(spans))


def _indexed_as_searched(mapping: dict, settings: dict, field: str) -> bool:
    """Whether a phrase query on ``field`` analyses its text as the field's values are
    indexed (a text field with no search analyzer of its own), so a word's term in its
    dictionary is what the query looks for."""
    node = field_mapping(mapping, field) or {}
    analyzers = settings.get("index", {}).get("analysis", {}).get("analyzer", {})
    if node.get("type") != "text" or {"default_search", "default_search_quoted"} & set(analyzers):
        return False
    analyzer = node.get("analyzer", "default")
    return all(node.get(k, analyzer) == analyzer
               for k in ("search_analyzer", "search_quote_analyzer"))


def capped_frequencies(engine: Engine, index: str, terms: dict[str, str], bound: int,
                       fields: list[str], basis: DfBasis, batch: int = COUNTS_BATCH, *,
                       pair_fields: Collection[str] = (), bounds: Bounds | None = None,
                       ) -> dict[str, int]:
    """min(DF, ``bound``) of each term, as ``bounded_frequencies``, in two rounds where the
    bound is high (apply under a cap known beforehand): every term counted up to
    FIRST_BOUND, one search each, then the few whose count stopped there up to ``bound``,
    whole where the engine counts them whole. Sketch validation, which waits for its
    counts, takes one round instead. Given ``bounds`` (with the words that keep a range
    across the bound counted, ``exact_words``), a term whose range lies below the
    bound is not counted (its value: the range's low end, on the same side of the bound as
    its DF), nor one whose range starts at the bound (its value: the bound)."""
    decided: dict[str, int] = {}
    if bounds is not None:
        bounds = exact_words(engine, index, bounds, terms, bound, fields, batch)
        for norm, text in terms.items():
            low, high = bounds.range(norm, text)
            if high < bound or low >= bound:
                decided[norm] = low if high < bound else bound
        terms = {n: t for n, t in terms.items() if n not in decided}
    first = min(bound, FIRST_BOUND)
    counts, stopped = _bounded(engine, index, terms, first, fields, basis, batch, pair_fields,
                               whole=False)
    if first < bound and stopped:
        counts |= _bounded(engine, index, {n: terms[n] for n in stopped}, bound, fields,
                           basis, batch, pair_fields)[0]
    return decided | {norm: min(df, bound) for norm, df in counts.items()}


def _bounded(engine: Engine, index: str, terms: dict[str, str], bound: int, fields: list[str],
             basis: DfBasis, batch: int, pair_fields: Collection[str], whole: bool = True,
             ) -> tuple[dict[str, int], set[str]]:
    """Each term's count, and the terms whose count stopped at the bound on some shard
    (``terminated_early``: at least ``bound``, the DF unknown past it); the others' counts
    are their whole DF, above the bound too where the engine counted a term whole.
    ``whole``: count whole what the engine counts from its term dictionary (else one search
    per term, each stopping at the bound: cheaper while the bound is low)."""
    pairs = len(fields) == 1 and fields[0] in pair_fields
    # made a batch at a time: the client holds one batch of search bodies, not every one
    searches = ((norm, body) for norm, text in terms.items()
                for body in _counts(text, norm, bound, basis, fields, pairs, whole))
    out = dict.fromkeys(terms, 0)
    stopped: set[str] = set()
    while chunk := list(islice(searches, batch)):
        responses = engine.msearch(index, [body for _, body in chunk])
        for (norm, _), response in zip(chunk, responses, strict=True):
            out[norm] += int(response["hits"]["total"]["value"])
            if response.get("terminated_early"):
                stopped.add(norm)
    return out, stopped


def _counts(text: str, norm: str, bound: int, basis: DfBasis, fields: list[str],
            pairs: bool = False, whole: bool = True) -> list[dict]:
    """Count-only searches whose totals add up to the term's DF, each either whole or
    stopping on each shard after ``bound`` matches (``terminate_after``). A term query is
    counted whole: the engine counts it from its term dictionary (Lucene's count shortcut) in
    each segment without deletions and walks its postings in the others, and the count is its
    DF past the bound too, so a term that reached a bound needs no count after it. That is a
    proposed term (a keyword), or one ASCII word looked for in one field (two, where the field
    indexes two-word phrases as terms: ``pairs``); under the ``both`` basis such a word is its
    text count plus the documents it was proposed for without it in the text (a walk of its
    proposals' postings, stopping at the bound). A phrase, a word the analyzer may split
    (hyphens, other scripts) or several fields, or anything when not ``whole``: one
    search that stops at the bound."""
    def count(query: dict, stop: bool) -> dict:
        body = {"size": 0, "track_total_hits": True, "query": query}
        return body | {"terminate_after": bound} if stop else body

    words = text.split()
    whole_term = whole and len(fields) == 1 and 0 < len(words) <= (2 if pairs else 1) and \
        dictionary_words(text)
    if (basis == "proposals" and whole) or (whole_term and basis == "text"):
        return [count(_clause(text, norm, basis, fields), stop=False)]
    if whole_term and basis == "both":
        in_text = _clause(text, norm, "text", fields)
        only_proposed = {"bool": {"filter": [_clause(text, norm, "proposals", fields)],
                                  "must_not": [in_text]}}
        return [count(in_text, stop=False), count(only_proposed, stop=True)]
    return [count(_clause(text, norm, basis, fields), stop=True)]


def top_frequencies(engine: Engine, index: str, terms: dict[str, str], k: int,
                    basis: DfBasis, fields: list[str], batch: int = COUNTS_BATCH,
                    first: int = FIRST_BOUND, step: int = BOUND_STEP, *,
                    pair_fields: Collection[str] = (), bounds: Bounds | None = None,
                    ) -> dict[str, int]:
    """Counts of each term from which the ``k``-th largest DF is exact (what the rank policy
    needs), with a cost per term that does not grow with the collection: every term counted
    up to FIRST_BOUND, one search each; while the k-th largest DF or a stopped term's place
    against it is unknown, the terms that stopped counted again with a bound BOUND_STEP times
    higher, whole where the engine counts them whole (``_counts``): most terms are rare, so
    a count that stops early costs them least, and under the ``both`` basis a whole count
    takes two searches. A term that never stopped has its exact DF; one that stopped has a
    count at or above the k-th largest DF, so the same decision as its DF under the cap that
    follows (``policies.Rank``).

    Given ``bounds`` (with the words that keep a range across the floor counted,
    ``exact_words``), only the terms that may be among the k most common are counted: the
    k-th largest low end (``floor``) is at most the k-th largest DF, so a term whose range
    ends below it is not among them and is kept under the cap whatever its DF; its value is
    its low end, below the k-th largest DF, so the cap comes out the same. The others are
    counted up to the floor at first, not FIRST_BOUND: one whose count stopped below the
    floor would be counted again, and a phrase of common words walks its words' postings
    each time (three times from 64 to a DF of a few thousand)."""
    decided: dict[str, int] = {}
    bound = first
    if bounds is not None and terms:
        if k <= 0:  # no cap
            return {norm: bounds.range(norm, text)[0] for norm, text in terms.items()}
        bounds = exact_words(engine, index, bounds, terms, _floor(bounds, terms, k), fields,
                             batch)
        floor = _floor(bounds, terms, k)  # the words counted raise one-word terms' ranges
        for norm, text in terms.items():
            low, high = bounds.range(norm, text)
            if high < floor:
                decided[norm] = low
        terms = {n: t for n, t in terms.items() if n not in decided}
        # a term that stops under the floor is counted again, so the first count goes to it
        bound = max(first, floor)
    counts, stopped = _bounded(engine, index, terms, bound, fields, basis, batch, pair_fields,
                               whole=False)
    while stopped and not _kth_known(counts, stopped, k):
        bound *= step
        again, stopped = _bounded(engine, index, {n: terms[n] for n in stopped}, bound,
                                  fields, basis, batch, pair_fields)
        counts |= again
    return decided | counts


def _floor(bounds: Bounds, terms: dict[str, str], k: int) -> int:
    """The k-th largest low end of the terms' ranges: at most the k-th largest DF."""
    return heapq.nlargest(k, (bounds.range(n, t)[0] for n, t in terms.items()))[-1]


def _kth_known(counts: dict[str, int], stopped: set[str], k: int) -> bool:
    """Whether the k-th largest DF is exact, and every stopped term (DF at least its count)
    is at or above it, whatever the stopped terms' DFs are."""
    if k <= 0:  # no cap: no term's DF decides anything
        return True
    rank = min(k, len(counts)) - 1
    low = sorted(counts.values(), reverse=True)[rank]  # the stopped terms at their counts
    high = sorted((float("inf") if n in stopped else df for n, df in counts.items()),
                  reverse=True)[rank]  # and past any count
    return low == high and all(counts[n] >= low for n in stopped)


def proposal_frequencies(engine: Engine, index: str, page: int = 1000) -> Counter[str]:
    """Documents per proposed term over the whole collection (composite aggregation, paged)."""
    counts: Counter[str] = Counter()
    after = None
    while True:
        composite: dict = {"size": page,
                           "sources": [{"term": {"terms": {"field": PROPOSED_TERMS}}}]}
        if after:
            composite["after"] = after
        result = engine.aggregate(index, {"tags": {"composite": composite}})["tags"]
        for bucket in result["buckets"]:
            counts[bucket["key"]["term"]] = int(bucket["doc_count"])
        after = result.get("after_key")
        if not result["buckets"] or not after:
            return counts
