"""Pure units, no engine: the filter policies' caps, the query bodies, rank fusion and the
bench's tuning. The same functions run against the engines in the other test files."""

from __future__ import annotations

import math
import typing

import pytest

from pipeline import dfstats, policies, query
from pipeline.bench.inputs import Split
from pipeline.bench.report import Report
from pipeline.bench.run import Config
from pipeline.bench.tune import MAX_N_GRID, W_GRID, W_GROWTH, tune
from pipeline.config import EnrichSettings
from pipeline.profile import Profile
from pipeline.query import Hit

# -- policies ------------------------------------------------------------------------------


def test_counts_stop_at_the_bound_unless_the_term_dictionary_answers() -> None:
    """A term query is counted whole (the engine's count shortcut, no postings walked); a
    phrase, a word the analyzer may split, several fields or a disjunction stop at the bound
    (the exactness of all of them on 3 shards: test_enrich)."""
    def searches(text: str, basis: str = "text", fields: tuple[str, ...] = ("enriched",)
                 ) -> list[bool]:  # whether each search stops at the bound
        bodies = dfstats._counts(text, text.lower(), 51, basis, list(fields))  # type: ignore[arg-type]
        assert all(b["size"] == 0 and b["track_total_hits"] is True for b in bodies)
        return [b.get("terminate_after") == 51 for b in bodies]

    assert searches("Cell") == searches("h2o") == searches("cell", "proposals") == [False]
    assert searches("heart attack", "proposals") == [False]  # a keyword: one term
    assert searches("heart attack") == searches("covid-19") == searches("naïve") == [True]
    assert searches("cell", fields=("sira.echo", "title")) == [True]
    assert searches("heart attack", "both") == [True]
    # both: the text's count whole, plus the proposals without the word in the text
    assert searches("cell", "both") == [False, True]
    # a field that indexes two-word phrases as terms: two words are one term too
    two = dfstats._counts("heart attack", "heart attack", 51, "text", ["enriched"], True)
    assert "terminate_after" not in two[0]
    three = dfstats._counts("acute heart attack", "acut heart attack", 51, "text",
                            ["enriched"], True)
    assert three[0]["terminate_after"] == 51
    # not whole (apply's first, low bound): one search per term, every one stopping
    for text, basis in [("cell", "both"), ("cell", "text"), ("cell", "proposals")]:
        bodies = dfstats._counts(text, text, 64, basis, ["contents"], True, whole=False)
        assert [b.get("terminate_after") for b in bodies] == [64], basis
    only_proposed = dfstats._counts("cell", "cell", 51, "both", ["contents"])[1]["query"]
    assert only_proposed == {"bool": {
        "filter": [{"term": {"sira.proposed_terms": "cell"}}],
        "must_not": [{"multi_match": {"query": "cell", "type": "phrase", "fields": ["contents"]}}]}}


def test_each_policy_caps_as_documented() -> None:
    dfs = [40, 30, 30, 20, 5, 1]
    assert policies.make("none").cap(1000, dfs) is None
    assert policies.make("ratio", ratio=0.01).cap(1000, dfs) == 10
    assert policies.make("absolute", absolute_cap=7).cap(1000, dfs) == 7
    assert policies.make("rank", rank_k=1).cap(1000, dfs) == 39  # the most common goes
    assert policies.make("rank", rank_k=2).cap(1000, dfs) == 29  # ties with the 2nd go too
    assert policies.make("rank", rank_k=0).cap(1000, dfs) is None
    assert policies.make("rank", rank_k=50).cap(1000, [1, 1]) == 1  # singletons are kept
    assert policies.make("rank", rank_k=5).cap(1000, []) is None
    assert policies.keeps(29, 29) and not policies.keeps(30, 29) and policies.keeps(10**6, None)


def test_policy_kinds_are_one_list_and_round_trip() -> None:
    assert set(policies.KINDS) == set(typing.get_args(policies.PolicyKind))
    for kind, cls in policies.KINDS.items():
        assert bool(cls.param) == bool(cls.grid) == bool(cls.option), kind
        if cls.param:  # the parameter is a settings field and a profile field of that name
            assert cls.param in EnrichSettings.model_fields and cls.param in Profile.model_fields
            assert getattr(cls(), cls.param) == EnrichSettings.model_fields[cls.param].default
        policy = policies.make(kind, rank_k=7, ratio=0.2, absolute_cap=9)
        assert policies.from_values(policy.stored()) == policy
        assert policy.describe()
    # other kinds' parameters do not make two equal policies differ
    assert policies.from_values({"policy": "none", "rank_k": 3}) == policies.NoCap()
    assert Profile(policy="ratio", ratio=0.2).filter_policy() == policies.Ratio(0.2)


# -- query bodies --------------------------------------------------------------------------

def _should(body: dict) -> list[dict]:
    return body["query"]["bool"]["should"]


def test_the_two_clause_query() -> None:
    plain = query.build_query("disk watermark", w=0.0, size=5)
    assert plain["size"] == 5
    assert _should(plain)[0]["multi_match"] == {
        "query": "disk watermark", "type": "most_fields",
        "fields": ["sira.echo", "sira.bridge", "contents"]}
    assert [next(iter(c)) for c in _should(plain)] == ["multi_match", "match_none"]
    # w = 0 drops the sketch: exactly the literal query
    assert query.build_query("disk watermark", {"flood": 1}, w=0.0, size=5) == plain

    body = query.build_query("disk", {"flood": 2, "stage": 1}, w=0.7, classes="both")
    terms = [c["term"] for c in _should(body) if "term" in c]
    assert terms == [{"enriched": {"value": "flood", "boost": pytest.approx(1.4)}},
                     {"enriched": {"value": "stage", "boost": pytest.approx(0.7)}}]
    literal_only = query.build_query("disk", {"flood": 1}, w=1.0, classes="none")
    assert _should(literal_only)[0]["multi_match"]["fields"] == ["contents"]
    assert [c["term"] for c in _should(literal_only) if "term" in c] == [
        {"contents": {"value": "flood", "boost": 1.0}}]
    named = query.build_query("disk", {"flood": 1}, w=1.0, classes="echo", named=True)
    names = [c["multi_match"]["_name"] if "multi_match" in c else
             next(iter(c["term"].values()))["_name"] for c in _should(named)[:-1]]
    assert names == ["literal", "expansion:flood@sira.echo", "expansion:flood@contents"]


def test_expansion_terms_count_repeats_and_search_bodies() -> None:
    assert query.expansion_terms(["disk flood", "flood stage"]) == {"disk": 1, "flood": 2,
                                                                     "stage": 1}
    bodies = query.search_bodies("q", {"t": 1}, ["other phrasing"], w=0.5, classes="both",
                                 size=3, source=False)
    assert len(bodies) == 2 and all(b["_source"] is False and b["explain"] is False
                                    for b in bodies)
    assert bodies[1] == {**query.build_query("other phrasing", size=3), "_source": False,
                         "explain": False}
    params = query.template_params("q", {"t": 1}, w=0.5, classes="none")
    assert params["skip_echo"] and params["skip_bridge"] and params["terms"][0]["boost"] == 0.5


# -- fusion --------------------------------------------------------------------------------

def _hits(*ids: str) -> list[Hit]:
    return [Hit(id=i, score=1.0, title="", text="") for i in ids]


def test_reciprocal_rank_fusion() -> None:
    fused = query.rrf([_hits("a", "b", "c"), _hits("b", "d")], size=3, k=60)
    assert [h.id for h in fused] == ["b", "a", "d"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert fused[1].score == pytest.approx(1 / 61)
    # equal fused scores: by id, so a ranking never depends on dict order
    assert [h.id for h in query.rrf([_hits("z"), _hits("y")], size=2)] == ["y", "z"]


# -- tuning --------------------------------------------------------------------------------

class _Runner:
    """Ranks the relevant document lower the further w is from ``best_w``."""

    def __init__(self, best_w: float) -> None:
        self.best_w = best_w
        self.calls: list[tuple[float, int]] = []

    def run(self, config: Config, queries: dict[str, str], *, w: float, max_n: int,
            cap: int | None) -> dict:
        self.calls.append((w, max_n))
        rank = 1 + round(abs(math.log(w / self.best_w)) * 4) + (max_n == 2)
        others = [(f"x{i}", 1.0) for i in range(rank - 1)]
        return {q: [*others, ("rel", 0.5)] for q in queries}


@pytest.mark.parametrize("best_w", [0.3, 2.25])
def test_tuning_picks_the_best_w_and_grows_the_grid_at_its_edge(best_w: float) -> None:
    runner = _Runner(best_w)
    dev = Split({"q1": "a query"}, {"q1": {"rel": 1}})
    report = Report("unit", "none", "test", "dev", settings={})
    best = tune(runner, lambda policy: None, dev, report, has_proposals=False,
                has_sketches=True, tick=lambda: None)
    assert best["query"] == (best_w, 1)
    tried = sorted({w for w, _ in runner.calls})
    if best_w <= W_GRID[-1]:
        assert tried == W_GRID
    else:  # 1.0 was best, then 1.5, then 2.25; 3.375 was tried and lost
        assert tried == [*W_GRID, W_GRID[-1] * W_GROWTH, 2.25, pytest.approx(3.375)]
    assert {n for _, n in runner.calls} == set(MAX_N_GRID)
    assert report.chosen["query.w"]["value"] == best_w


def test_an_empty_keyword_is_skipped_a_non_string_refused() -> None:
    from pipeline.llm import BadAnswer, parse_keywords

    assert parse_keywords('{"keywords": ["", " heap size ", "  "]}', "stop") == ["heap size"]
    with pytest.raises(BadAnswer, match="must hold strings"):
        parse_keywords('{"keywords": ["heap", 3]}', "stop")


def test_first_run_measures_by_rank() -> None:
    """The demo's nDCG@10 / R@10 score the engine's order (ties included) by rank."""
    from pipeline.demo import Compared, measures

    def hits(*ids: str) -> list[Hit]:
        return [Hit(i, 1.0, i, "") for i in ids]  # equal scores: only the order tells

    row = Compared("q", "text", {"good"})
    row.rankings = {"BM25": hits("bad", "good"), "+ doc terms": hits("good", "bad"),
                    "+ sketch": hits("bad", "worse")}
    row2 = Compared("q2", "text", {"x"})
    row2.rankings = {c: hits("x") for c in row.rankings}
    assert row.first_judged("BM25") == 2 and row.first_judged("+ sketch") is None
    figures = measures([row, row2], {"q": {"good": 1}, "q2": {"x": 1}})
    assert figures["BM25"]["nDCG@10"] == pytest.approx((1 / math.log2(3) + 1) / 2)
    assert figures["+ doc terms"] == {"nDCG@10": 1.0, "R@10": 1.0}
    assert figures["+ sketch"] == {"nDCG@10": 0.5, "R@10": 0.5}

