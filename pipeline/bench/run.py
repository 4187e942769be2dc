"""The configurations and what runs them: ``sira search``'s own search bodies
(``query.search_bodies``) and ``enrich.apply``, with the parameters passed in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pipeline import dfstats, enrich, policies, query
from pipeline.bench.measures import DEPTH, Run
from pipeline.config import Settings
from pipeline.engine import Engine, SearchRefused
from pipeline.profile import DEFAULT_MAX_N, DEFAULT_W, Classes
from pipeline.schema import Layout


@dataclass(frozen=True)
class Config:
    name: str
    classes: Classes = "both"
    sketch: bool = False
    policy: str | None = None  # a policy kind to apply first; None = the tuned default
    needs_proposals: bool = True
    also: bool = False  # fuse the collection's alternative phrasings (RRF, equal weights)


CONFIGS = [
    Config("bm25", classes="none", needs_proposals=False),
    Config("doc"),
    Config("doc:echo", classes="echo"),
    Config("doc:bridge", classes="bridge"),
    Config("doc+query", sketch=True),
    Config("query", classes="none", sketch=True, needs_proposals=False),
    Config("doc[none]", policy="none"),
    Config("doc[ratio]", policy="ratio"),
    Config("doc[absolute]", policy="absolute"),
    Config("doc[rank]", policy="rank"),
    Config("doc+also", also=True),
]



class Runner:
    """Runs configurations over query sets against one bench index."""

    def __init__(self, engine: Engine, settings: Settings, sketches: dict[str, list[str]],
                 phrasings: dict[str, list[str]] | None = None,
                 max_sketch_terms: int | None = None):
        self.engine = engine
        self.settings = settings
        self.index = settings.index.name
        self.sketches = sketches
        self.phrasings = phrasings or {}
        self.max_sketch_terms = max_sketch_terms
        self._validated: dict[tuple, dict[str, query.Validation]] = {}

    def expansion(self, qid: str, cap: int | None, max_n: int, enriched: bool
                  ) -> query.Validation:
        """The validated sketch of one query; the first call for a setting validates the
        sketches of every query at once (a few requests instead of two per query)."""
        setting = (cap, max_n, enriched, self.index)
        if setting not in self._validated:
            fields = dfstats.ENRICHED_FIELDS if enriched else dfstats.TEXT_FIELDS
            self._validated[setting] = query.validate_many(
                self.engine, self.index, self.sketches, cap, max_n, fields,
                self.max_sketch_terms,
                pair_fields=Layout.of(self.engine.get_meta(self.index)).pair_fields)
        return self._validated[setting].get(qid, query.Validation([], [], {}))

    def run(self, config: Config, queries: dict[str, str], *, w: float = DEFAULT_W,
            max_n: int = DEFAULT_MAX_N,
            cap: int | None = None, on_query: Callable[[], None] | None = None) -> Run:
        qids = list(queries)
        bodies, owners = [], []
        for qid in qids:
            expansion = self.expansion(qid, cap, max_n, config.classes != "none").terms \
                if config.sketch else {}
            also = self.phrasings.get(qid, []) if config.also else []
            searches = query.search_bodies(queries[qid], expansion, also, w=w,
                                           classes=config.classes, size=DEPTH, source=False)
            bodies += searches
            owners += [qid] * len(searches)
        rankings: dict[str, list[list[query.Hit]]] = {qid: [] for qid in qids}
        for start in range(0, len(bodies), 64):
            try:
                responses = self.engine.msearch(self.index, bodies[start:start + 64])
            except SearchRefused as exc:
                raise RuntimeError(f"query {owners[start + exc.position]}: {exc}") from exc
            for qid, response in zip(owners[start:start + 64], responses, strict=True):
                rankings[qid].append([query.Hit(h["_id"], float(h["_score"]), "", "")
                                      for h in response["hits"]["hits"]])
        run: Run = {}
        for qid in qids:
            run[qid] = [(h.id, h.score) for h in query.combine(rankings[qid], DEPTH)]
            if on_query:
                on_query()
        return run


class Applier:
    """Puts a filter policy in force for the runner. Each policy gets an index of its own,
    every document written once with its final enrichment: updating documents in place
    leaves deleted copies that BM25 statistics still count (the engine retains them for its
    soft-deletes leases), which would skew one policy against another. The proposals and
    their DF statistics come from the bench index and are read once."""

    def __init__(self, engine: Engine, settings: Settings, runner: Runner):
        self.engine, self.settings, self.runner = engine, settings, runner
        self.base = settings.index.name
        self.table: enrich.TermTable | None = None
        self.built: dict[policies.Policy, tuple[str, int | None]] = {}

    def __call__(self, policy: policies.Policy) -> int | None:
        if policy not in self.built:
            self.built[policy] = self._build(policy, f"{self.base}-p{len(self.built)}")
        self.runner.index, cap = self.built[policy]
        return cap

    def _build(self, policy: policies.Policy, name: str) -> tuple[str, int | None]:
        if self.table is None:
            self.table = enrich.term_table(self.engine, self.base, self.settings.enrich.df_basis)
        cap = policy.cap(self.table.n_docs, self.table.df.values())
        self.engine.create_index(self.settings.index.model_copy(update={"name": name}),
                                 recreate=True)

        def documents() -> Iterator[dict]:
            for hit in self.engine.scan(self.base):
                doc = {"_id": hit["_id"], **hit["_source"]}
                sira = doc.get("sira", {})
                if sira.get("proposed_hash") is not None:
                    sira["echo"], sira["bridge"] = enrich.enrichment_fields(
                        enrich.kept_terms(enrich.stored_terms(doc), self.table.df, cap))
                yield doc

        result = self.engine.bulk_index(name, documents())
        if result.failed:
            raise RuntimeError(f"{name}: {result.failed} documents rejected: "
                               f"{result.failures[0].reason}")
        self.engine.refresh(name)
        return name, cap

    def cleanup(self, keep: policies.Policy | None) -> str | None:
        """Delete the policy indices but ``keep``'s; return the kept index name."""
        kept = None
        for policy, (name, _) in self.built.items():
            if policy == keep:
                kept = name
            else:
                self.engine.delete_index(name)
        return kept

