"""Realistic documents and proposals in any number, for ``sira bench-scale``: a generator
fitted on a real BEIR collection and the proposals recorded for it.

- Words: a Zipf-Mandelbrot law over an unbounded vocabulary, P(rank r) ~ (r + q)^-a, fitted
  on each real document's distinct words (so that its draws follow document frequencies), so
  the vocabulary seen grows like the real one (Heaps' law: a from the real collection's growth
  exponent, q so that the vocabulary at the real collection's size matches); rank r is the
  collection's r-th most frequent word, made-up words past its vocabulary. A word repeats an
  earlier word of its document (any of them alike, so words already repeated repeat more) as
  often as real words do: words drawn independently put a mid-frequency word into two to
  four times as many documents as real text does, where words cluster in the documents
  about them.
- Lengths: title and text lengths drawn from the real documents'.
- Proposals: as many per document as a recorded document has, the recorded share of them
  found in the document ("key"), each class from a Zipf-Mandelbrot law of its own fitted the
  same way on the recorded terms of that class (the most proposed first, then made-up phrases
  of the recorded lengths: key ones of the collection's words, new ones of made-up words);
  key terms are written into the document's text, replacing as many words, so that they are
  found in it as in a real document.

What it does not model: topics beyond the key terms (words are drawn independently, so a
two-word phrase of common words is rarer than in real text); made-up new terms never occur in
any text. ``check`` says how close the statistics come at the real collection's size.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

WORD = re.compile(r"[^\W_]+")
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aiou"  # made-up words the stemmer leaves alone
MAX_RANK = 2**40
HEAD_MIN_DF = 2


def made_up_word(rank: int) -> str:
    syllables = []
    while True:
        rank, s = divmod(rank, len(CONSONANTS) * len(VOWELS))
        syllables.append(CONSONANTS[s // len(VOWELS)] + VOWELS[s % len(VOWELS)])
        if rank == 0:
            return "".join(syllables) + "x"


@dataclass(frozen=True)
class Zipf:
    """Ranks from 1 with P(r) ~ (r + q)^-a (a > 1), drawn as the floor of a shifted Pareto."""

    a: float
    q: float

    def draw(self, rng: np.random.Generator, n: int, past: int = 0) -> np.ndarray:
        """``n`` ranks, each above ``past`` (the law's tail beyond it)."""
        y = (past + 1 + self.q) * rng.random(n) ** (-1 / (self.a - 1))
        return np.minimum(np.floor(y - self.q), MAX_RANK).astype(np.int64)

    def expected_distinct(self, n: float, ranks: int = 2_000_000) -> float:
        """Expected number of distinct ranks in n draws."""
        r = np.arange(1, ranks + 1, dtype=np.float64)
        s = self.a - 1
        tail = lambda x: ((x + self.q) / (1 + self.q)) ** -s  # noqa: E731  P(rank >= x)
        p = tail(r) - tail(r + 1)
        # past ``ranks`` every probability is tiny: each contributes about n * p
        return float(np.sum(-np.expm1(n * np.log1p(-p))) + n * tail(ranks + 1))

    @staticmethod
    def fit(stream: list[int]) -> Zipf:
        """a from the growth exponent of the distinct values of ``stream`` between a quarter
        and all of it; q so that the expected distinct count at its length matches."""
        n = len(stream)
        seen: set[int] = set()
        at: dict[int, int] = {}
        for i, x in enumerate(stream, 1):
            seen.add(x)
            if i in (n // 4, n):
                at[i] = len(seen)
        slope = np.log(at[n] / at[n // 4]) / np.log(n / (n // 4))
        a = float(np.clip(1 / max(slope, 1e-3), 1.05, 5.0))
        low, high = 1e-3, 1e4
        for _ in range(24):  # more q flattens the head: more distinct values
            mid = (low * high) ** 0.5
            low, high = (mid, high) if Zipf(a, mid).expected_distinct(n) < at[n] else (low, mid)
        return Zipf(a, (low * high) ** 0.5)


def words_of(text: str) -> list[str]:
    return WORD.findall(text.lower())


@dataclass
class Generator:
    words: Zipf
    vocabulary: list[str]  # by frequency
    title_lengths: np.ndarray
    text_lengths: np.ndarray
    new: Zipf
    new_terms: list[str]  # by how many documents they were proposed for
    key: Zipf
    key_terms: list[str]
    per_doc: np.ndarray  # proposals per document
    key_share: float
    key_lengths: np.ndarray  # words per key term
    new_lengths: np.ndarray  # words per new term
    repeat: float = 0.0  # the share of a document's words that repeat an earlier one of it
    # the words in at least HEAD_MIN_DF real documents, drawn at their rate: cumulative
    # probabilities by rank, and the share of draws that are theirs
    head: np.ndarray = field(default_factory=lambda: np.zeros(0))
    head_share: float = 0.0

    @classmethod
    def fit(cls, dataset: Path, proposals: Path, seed: int = 7) -> Generator:
        rng = np.random.default_rng(seed)
        docs = [json.loads(line) for line in (dataset / "corpus.jsonl").open(encoding="utf-8")]
        order = rng.permutation(len(docs))
        ids: dict[str, int] = {}
        stream: list[int] = []  # each document's distinct words, in order
        freq: Counter[str] = Counter()
        titles, texts = [], []
        for i in order:
            title, text = words_of(docs[i].get("title") or ""), words_of(docs[i]["text"])
            titles.append(len(title))
            texts.append(len(text))
            for w in dict.fromkeys(title + text):
                stream.append(ids.setdefault(w, len(ids)))
            freq.update(set(title + text))
        recorded = [json.loads(line) for line in proposals.open(encoding="utf-8")]
        recorded = [r for r in recorded if r.get("terms")]
        rng.shuffle(recorded)  # type: ignore[arg-type]
        streams = {kind: _term_stream(recorded, kind) for kind in ("new", "key")}
        keys = [t for r in recorded for t in r.get("key") or []]
        news = [t for r in recorded for t in r.get("new") or []]
        head = np.array([df for _, df in freq.most_common() if df >= HEAD_MIN_DF], dtype=float)
        return cls(
            words=Zipf.fit(stream), vocabulary=[w for w, _ in freq.most_common()],
            title_lengths=np.array(titles), text_lengths=np.array(texts),
            new=Zipf.fit(streams["new"][0]), new_terms=streams["new"][1],
            key=Zipf.fit(streams["key"][0]), key_terms=streams["key"][1],
            per_doc=np.array([len(r["terms"]) for r in recorded]),
            key_share=len(keys) / max(1, len(keys) + len(news)),
            key_lengths=np.array([len(words_of(t)) or 1 for t in keys] or [1]),
            new_lengths=np.array([len(words_of(t)) or 1 for t in news] or [1]),
            repeat=1 - len(stream) / max(1, sum(titles) + sum(texts)),
            head=np.cumsum(head) / max(1.0, head.sum()), head_share=head.sum() / len(stream))

    def _word(self, rank: int) -> str:
        return self.vocabulary[rank - 1] if rank <= len(self.vocabulary) else made_up_word(rank)

    def _drawn(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` word ranks drawn independently: a real word in the head at its rate, else
        one from the law's tail past the head (rarer real words, then made-up ones). The law
        alone, fitted on the vocabulary's growth, gave the most common words a third of
        their real document frequency."""
        in_head = rng.random(n) < self.head_share
        from_head = np.searchsorted(self.head, rng.random(n), side="right") + 1
        return np.where(in_head, np.minimum(from_head, len(self.head)),
                        self.words.draw(rng, n, past=len(self.head)))

    def _ranks(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """The word ranks of one document of ``n`` words: each a new draw, or, with the
        probability ``repeat``, a copy of an earlier word of the document picked uniformly."""
        ranks = self._drawn(rng, n)
        at = np.arange(n)
        source = np.where(rng.random(n) < self.repeat, (rng.random(n) * at).astype(np.int64), at)
        while True:  # a copy of a copy: follow the chain back to a drawn word
            deeper = source[source]
            if np.array_equal(deeper, source):
                return ranks[source]
            source = deeper

    def _term(self, ranked: list[str], rank: int, lengths: np.ndarray, *, words: bool) -> str:
        """The term of ``rank`` in its class: a recorded one, or else a made-up phrase, of the
        collection's words (``words``: a key term, found in text) or of made-up words."""
        if rank <= len(ranked):
            return ranked[rank - 1]
        length = int(lengths[rank % len(lengths)])
        if words:
            return " ".join(self._word(int(r)) for r in
                            self._drawn(np.random.default_rng(rank), length))
        return " ".join(made_up_word(rank * 7 + i) for i in range(length))

    def documents(self, n: int, seed: int, prefix: str = "g"
                  ) -> Iterator[tuple[dict, dict]]:
        """(document, proposals line) for ``n`` new documents."""
        rng = np.random.default_rng(seed)
        for i in range(n):
            pick = rng.integers(len(self.text_lengths))
            n_title, n_text = int(self.title_lengths[pick]), max(1, int(self.text_lengths[pick]))
            words = [self._word(int(r)) for r in self._ranks(rng, n_title + n_text)]
            title, text = words[:n_title], words[n_title:]
            count = int(self.per_doc[rng.integers(len(self.per_doc))])
            n_key = int(rng.binomial(count, self.key_share))
            key = [self._term(self.key_terms, int(r), self.key_lengths, words=True)
                   for r in self.key.draw(rng, n_key)]
            # into the text, in place of as many words, each in its own part of it (a text
            # too short for its terms gets them after it)
            part = len(text) // max(1, len(key))
            for j, term in enumerate(key):
                term_words = term.split()
                if len(term_words) > part:
                    text += term_words
                    continue
                start = j * part + int(rng.integers(part - len(term_words) + 1))
                text[start:start + len(term_words)] = term_words
            new = [self._term(self.new_terms, int(r), self.new_lengths, words=False)
                   for r in self.new.draw(rng, count - n_key)]
            doc_id = f"{prefix}{i}"
            yield ({"_id": doc_id, "title": " ".join(title), "text": " ".join(text)},
                   {"doc_id": doc_id, "terms": list(dict.fromkeys(key + new)), "key": key,
                    "new": new})


def _term_stream(recorded: list[dict], kind: str) -> tuple[list[int], list[str]]:
    """The recorded terms of one class as a stream of ids, and the terms by frequency."""
    ids: dict[str, int] = {}
    stream, freq = [], Counter()
    for r in recorded:
        for t in r.get(kind) or []:
            stream.append(ids.setdefault(t.lower(), len(ids)))
            freq[t.lower()] += 1
    return stream, [t for t, _ in freq.most_common()]


def vocabulary_growth(texts: Iterator[str], points: list[int]) -> dict[int, int]:
    """Distinct words after each of ``points`` documents."""
    seen: set[str] = set()
    out = {}
    for i, text in enumerate(texts, 1):
        seen.update(words_of(text))
        if i in points:
            out[i] = len(seen)
    return out


def describe(docs: list[dict], proposals: list[dict]) -> dict[str, float]:
    """The statistics the generator is checked on, for a list of documents and their
    proposals (recorded or generated)."""
    n = len(docs)
    lengths = np.array([len(words_of(f"{d.get('title') or ''} {d['text']}")) for d in docs])
    growth = vocabulary_growth((f"{d.get('title') or ''} {d['text']}" for d in docs),
                               [n // 4, n])
    bigrams: set[tuple[str, str]] = set()
    df: Counter[str] = Counter()  # documents per word
    for d in docs:
        w = words_of(d["text"])
        bigrams.update(zip(w, w[1:], strict=False))
        df.update(set(words_of(d.get("title") or "") + w))
    ranked = sorted(df.values(), reverse=True) + [0] * 100
    terms_per_doc = [len(p.get("terms") or []) for p in proposals]
    distinct_quarter = len({t.lower() for p in proposals[:len(proposals) // 4]
                         for t in p.get("terms") or []})
    distinct = len({t.lower() for p in proposals for t in p.get("terms") or []})
    key = sum(len(p.get("key") or []) for p in proposals)
    return {"documents": n, "words per document (mean)": float(lengths.mean()),
            "words per document (p90)": float(np.percentile(lengths, 90)),
            "distinct words at 1/4": growth[n // 4], "distinct words": growth[n],
            "distinct two-word phrases": len(bigrams),
            # what search and the DF statistics cost most: how many documents common words
            # are in (documents per word, at the word's rank by it)
            "words in over a tenth of the documents": sum(v > n / 10 for v in df.values()),
            "documents per word, 10th": ranked[9], "documents per word, 100th": ranked[99],
            "proposals per document": float(np.mean(terms_per_doc)),
            "distinct proposed terms at 1/4": distinct_quarter,
            "distinct proposed terms": distinct,
            "key share": key / max(1, sum(terms_per_doc))}


def check(generator: Generator, dataset: Path, proposals: Path) -> dict[str, tuple[float, float]]:
    """(real, generated) for each statistic, at the real collection's size."""
    docs = [json.loads(line) for line in (dataset / "corpus.jsonl").open(encoding="utf-8")]
    by_id = {json.loads(line)["doc_id"]: json.loads(line)
             for line in proposals.open(encoding="utf-8")}
    rng = np.random.default_rng(3)
    docs = [docs[i] for i in rng.permutation(len(docs))]
    real = describe(docs, [by_id.get(str(d["_id"]), {}) for d in docs])
    made = list(generator.documents(len(docs), seed=11))
    generated = describe([d for d, _ in made], [p for _, p in made])
    return {name: (real[name], generated[name]) for name in real}
