"""The evaluation instrument: measures against hand-computed values, the paired bootstrap,
bad recorded inputs, and a whole bench run on a small collection written by the test."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import pytest

from pipeline import bench
from pipeline.config import EnrichSettings, IndexSettings, Settings
from pipeline.engine import Engine
from pipeline.loaders import CorpusError


def test_measures_equal_hand_computed_values() -> None:
    qrels = {"q1": {"d1": 1, "d2": 1}, "q2": {"d3": 1}, "q3": {"d4": 1}}
    run = {"q1": [("d2", 3.0), ("x", 2.0), ("d1", 1.0)],
           "q2": [("a", 3.0), ("b", 2.0), ("d3", 1.0)],
           "q3": [("a", 1.0)]}
    values = bench.per_query(run, qrels)
    # q1: DCG = 1/log2(2) + 1/log2(4) = 1.5; ideal = 1 + 1/log2(3)
    assert values["q1"]["nDCG@10"] == pytest.approx(1.5 / (1 + 1 / math.log2(3)))
    assert values["q2"]["nDCG@10"] == pytest.approx(0.5)  # 1/log2(4)
    assert values["q3"]["nDCG@10"] == 0.0
    assert [values[q]["R@10"] for q in ("q1", "q2", "q3")] == [1.0, 1.0, 0.0]
    assert [values[q]["MRR@10"] for q in ("q1", "q2", "q3")] == pytest.approx([1, 1 / 3, 0])
    assert [values[q]["noise@10"] for q in ("q1", "q2", "q3")] == pytest.approx([0.8, 0.9, 1])
    assert bench.mean(values, "R@10") == pytest.approx(2 / 3)
    assert bench.mean(values, "MRR@10") == pytest.approx(4 / 9)
    assert bench.first_relevant(run, qrels) == {"q1": 1, "q2": 3, "q3": None}
    better = {**run, "q2": [("d3", 1.0)]}
    assert bench.moved(better, run, qrels) == (1, 0)
    assert bench.moved(run, better, qrels) == (0, 1)


def test_paired_bootstrap() -> None:
    same = [0.1 * (i % 7) for i in range(200)]
    low, high = bench.paired_bootstrap(same, same)
    assert low <= 0 <= high
    worse = [max(0.0, v - 0.05) for v in same]
    noisy_better = [v + 0.2 * ((i % 3) - 0.5) + 0.15 for i, v in enumerate(same)]
    low, high = bench.paired_bootstrap(noisy_better, worse)
    assert 0 < low < high


def test_bad_recorded_inputs_name_the_line(tmp_path: Path) -> None:
    sketches = tmp_path / "s.jsonl"
    sketches.write_text('{"query_id": "q1", "terms": ["a"]}\n{"query_id": "q9", "terms": []}\n')
    with pytest.raises(CorpusError, match=r"s.jsonl:2: unknown query id 'q9'"):
        bench.load_sketches(sketches, {"q1"})
    sketches.write_text('{"query_id": "q1", "terms": ["a"]}\n\n{"query_id": "q1"\n')
    with pytest.raises(CorpusError, match=r"s.jsonl:3: not a JSON line"):
        bench.load_sketches(sketches, {"q1"})


def make_collection(root: Path) -> tuple[Path, Path, Path]:
    (root / "qrels").mkdir(parents=True)
    topics = ["heap memory jvm", "disk watermark flood", "snapshot repository backup",
              "bulk indexing throughput", "shard allocation replica", "mapping field type"]
    docs, proposals, queries, qrels, sketches = [], [], [], [], []
    for t, topic in enumerate(topics):
        for i in range(5):
            doc_id = f"t{t}d{i}"
            docs.append({"_id": doc_id, "title": f"{topic.split()[0]} note {i}",
                         "text": f"{topic} detail {i} " + "common words here " * (i + 1)})
            proposals.append({"doc_id": doc_id, "terms": [f"{topic.split()[1]} tuning",
                                                          "generic tag"]})
        for j, split in enumerate(["test", "test", "train"]):
            qid = f"q{t}{j}"
            queries.append({"_id": qid, "text": f"{topic.split()[0]} problem {j}",
                            "also": [f"{topic.split()[1]} trouble"]})
            qrels.append((split, qid, f"t{t}d{j}"))
            sketches.append({"query_id": qid, "terms": [topic.split()[2], "unknownword"]})
    docs.append({"_id": "empty", "title": "", "text": " "})  # the loader leaves it out
    proposals.append({"doc_id": "empty", "terms": ["orphan"]})
    for name, rows in (("corpus", docs), ("queries", queries)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for split in ("test", "train"):
        (root / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n"
            + "".join(f"{q}\t{d}\t1\n" for s, q, d in qrels if s == split))
    prop, sk = root / "proposals.jsonl", root / "sketches.jsonl"
    prop.write_text("".join(json.dumps(r) + "\n" for r in proposals))
    sk.write_text("".join(json.dumps(r) + "\n" for r in sketches))
    return root, prop, sk


def test_bench_end_to_end(opensearch: Engine, tmp_path: Path) -> None:
    dataset, proposals, sketches = make_collection(tmp_path / "tiny")
    settings = Settings(index=IndexSettings(name=f"test-bench-{uuid.uuid4().hex[:8]}",
                                            bm25_k1=0.9, bm25_b=0.4))
    try:
        report, runs = bench.bench(opensearch, settings, dataset, proposals=proposals,
                                   sketches_path=sketches)
        assert list(report.rows) == [c.name for c in bench.CONFIGS]
        assert report.dev == "qrels/train.tsv" and report.settings["queries"] == 12
        assert report.notes == ["document empty left out: empty document (no title and no "
                                "text)", "1 proposal line(s) for left-out documents ignored"]
        assert set(report.chosen) >= {"rank.rank_k", "doc+query.w", "query.max_n"}
        assert all(v["chosen_on"] == "qrels/train.tsv" for v in report.chosen.values())
        bm25 = report.rows["bm25"]
        assert 0 < bm25["nDCG@10"] <= 1 and "dR@10" not in bm25
        doc = report.rows["doc"]
        assert {k: v for k, v in doc.items()} == report.rows["doc[rank]"]  # same policy
        assert doc["policy"].startswith("rank") and len(doc["dnDCG@10 CI"]) == 2
        assert doc["up"] + doc["down"] <= 12
        # the per-query values are the ones the summary averages
        assert report.rows["doc:echo"]["R@10"] == pytest.approx(
            bench.mean(report.per_query["doc:echo"], "R@10"), abs=1e-4)
        paths = bench.write(report, runs, tmp_path / "out")
        assert json.loads(paths["json"].read_text())["rows"]["bm25"] == bm25
        assert paths["png"].read_bytes()[:4] == b"\x89PNG"
        assert paths["png_queries"].read_bytes()[:4] == b"\x89PNG"
        best = bench.report.best_config(report)
        assert best != "bm25" and report.rows[best]["nDCG@10"] == max(
            row["nDCG@10"] for name, row in report.rows.items() if name != "bm25")
        assert "| doc+query |" in paths["md"].read_text()

        queries, _ = bench.beir_split(dataset, "test")
        sketched = bench.load_sketches(sketches, set(queries) | {"q02", "q12", "q22", "q32",
                                                                 "q42", "q52"})
        # rank K = 1: only "generic tag" (in every document) is too common
        one = settings.model_copy(update={"enrich": EnrichSettings(rank_k=1)})
        figures = bench.latency(opensearch, one, queries, sketched, repeat=2)
        merged = figures["force-merged"]
        assert figures["queries"] == 12 and merged["bm25"]["median"] >= 0
        assert merged["ratio_bm25"]["mean"] == pytest.approx(
            merged["two-clause"]["mean"] / max(merged["bm25"]["mean"], 1e-9))
        # an index written once, then merged into one segment
        assert figures["as written"]["segments"]["deleted_docs"] == 0
        assert merged["segments"] == {"segments": 1, "deleted_docs": 0}
        assert figures["expansion_terms"] > 0
        assert not opensearch.index_exists(f"{settings.index.name}-p0")  # cleaned up

        again, _ = bench.bench(opensearch, settings, dataset, proposals=proposals,
                               sketches_path=None)
        assert again.skipped == {"doc+query": "no sketches given", "query": "no sketches given"}
        assert "doc+also" in report.rows
        assert again.rows["bm25"] == bm25  # the index was reused, same ranking
    finally:
        opensearch.delete_index(settings.index.name)


def test_held_aside_dev_split_when_no_dev_qrels(tmp_path: Path) -> None:
    dataset, _, _ = make_collection(tmp_path / "tiny")
    (dataset / "qrels" / "train.tsv").unlink()
    test, dev, note = bench.splits(dataset, "test", None)
    assert len(dev.queries) == 3 and len(test.queries) == 9
    assert not set(dev.queries) & set(test.queries)
    assert "held aside" in note and "the other 9" in note
