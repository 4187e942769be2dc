"""A multi-shard index on a real 3-node OpenSearch cluster: counts from aggregations and
searches are exact across shards (the property the DF filter relies on)."""

from __future__ import annotations

import random
from collections import Counter

from pipeline.config import IndexSettings
from pipeline.engine import Engine

WORDS = ["heart", "lung", "kidney", "liver", "brain", "skin", "bone", "blood", "nerve", "eye"]


def test_multi_shard_counts_are_exact(cluster: Engine, index_settings: IndexSettings) -> None:
    assert cluster.health()["number_of_nodes"] == 3
    settings = index_settings.model_copy(update={"shards": 3, "replicas": 1})
    cluster.create_index(settings)
    try:
        rng = random.Random(7)
        docs = []
        for i in range(300):
            words = rng.sample(WORDS, k=rng.randint(1, 4))
            docs.append({"_id": f"doc-{i}", "title": f"note {i}", "text": " ".join(words),
                         "sira": {"proposed_terms": [f"tag-{w}" for w in words[:2]]}})
        result = cluster.bulk_index(settings.name, docs, chunk_size=64)
        assert (result.ok, result.failed) == (300, 0)
        cluster.refresh(settings.name)

        # the cluster may still be moving a shard to balance the nodes ("Node 3 -> … Node 2")
        cluster.client.cluster.health(index=settings.name, wait_for_status="green",
                                      wait_for_no_relocating_shards=True, timeout="60s")
        shards = cluster.client.cat.shards(index=settings.name, format="json")
        primaries = [s for s in shards if s["prirep"] == "p"]
        assert len(primaries) == 3
        assert len({s["node"] for s in shards}) == 3  # spread over the three nodes

        tag_df = Counter(t for d in docs for t in d["sira"]["proposed_terms"])
        aggs = cluster.aggregate(settings.name, {"tags": {"terms": {
            "field": "sira.proposed_terms", "size": 100}}})
        assert {b["key"]: b["doc_count"] for b in aggs["tags"]["buckets"]} == tag_df

        text_df = Counter(w for d in docs for w in set(d["text"].split()))
        responses = cluster.msearch(settings.name, [
            {"size": 0, "track_total_hits": True, "query": {"match": {"text": w}}}
            for w in WORDS
        ])
        got = {w: r["hits"]["total"]["value"] for w, r in zip(WORDS, responses, strict=True)}
        assert got == {w: text_df[w] for w in WORDS}
    finally:
        cluster.delete_index(settings.name)
