"""Corpus loaders on small files written by the tests: good input loads, bad input is named
by file and line and counted, never dropped silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.loaders import (
    CorpusError,
    LoadReport,
    beir_split,
    count_items,
    iter_corpus,
    iter_jsonl,
    iter_markdown,
)

LIMIT = 10_000


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def doc(id_: object, title: str = "t", text: str = "some text", **extra: object) -> bytes:
    return json.dumps({"_id": id_, "title": title, "text": text, **extra}).encode()


def test_jsonl_bad_lines_are_named_and_counted(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "c.jsonl", [
        doc("a"),
        b'{"_id": "b", "title": "broken',                      # 2: broken JSON
        b'{"_id": "c", "title": "caf\xe9"}',                    # 3: invalid UTF-8 (latin-1)
        doc("d", title="", text="   "),                        # 4: empty
        json.dumps({"title": "no id", "text": "x"}).encode(),  # 5: missing id
        doc("f", text="x" * (LIMIT + 1)),                      # 6: too large
        doc("a", text="again"),                                # 7: duplicate id
        b"[1, 2]",                                             # 8: not an object
        b"",                                                   # blank lines are not documents
        doc(9, metadata={"url": "u"}),                         # 10: numeric id, extra field
    ])
    report = LoadReport()
    docs = list(iter_jsonl(path, report, LIMIT))
    assert [d.id for d in docs] == ["a", "9"]
    assert docs[1].meta == {"metadata": {"url": "u"}}
    assert report.loaded == 2 and report.skipped == 7
    by_line = {p.line: p for p in report.problems}
    assert sorted(by_line) == [2, 3, 4, 5, 6, 7, 8]
    assert "broken JSON" in by_line[2].reason
    assert "invalid UTF-8" in by_line[3].reason
    assert "empty" in by_line[4].reason and by_line[4].doc_id == "d"
    assert "missing" in by_line[5].reason
    assert "too large" in by_line[6].reason
    assert "duplicate id, first seen at line 1" in by_line[7].reason
    assert "JSON object" in by_line[8].reason
    assert str(by_line[3]).startswith(f"{path}:3")


def test_beir_folder(tmp_path: Path) -> None:
    (tmp_path / "qrels").mkdir()
    write_lines(tmp_path / "corpus.jsonl", [doc("d1"), doc("d2")])
    write_lines(tmp_path / "queries.jsonl", [
        json.dumps({"_id": "q1", "text": "first"}).encode(),
        json.dumps({"_id": "q2", "text": "unjudged"}).encode(),
    ])
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\n")
    report = LoadReport()
    assert [d.id for d in iter_corpus(tmp_path, report, LIMIT)] == ["d1", "d2"]
    queries, qrels = beir_split(tmp_path, "test")
    assert queries == {"q1": "first"} and qrels == {"q1": {"d2": 1}}
    with pytest.raises(CorpusError, match="no qrels for split 'dev'"):
        beir_split(tmp_path, "dev")
    assert count_items(tmp_path) == 2


def test_markdown_notes(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.md").write_text(
        "---\ntitle: Heap sizing\ntags: [jvm, memory]\ndate: 2026-01-02\n---\n"
        "Keep the heap under 31 GB, see [[Compressed oops|pointers]] and [[GC]].\n"
    )
    (tmp_path / "sub" / "b.md").write_text("# Snapshots\n\nTake them nightly.\n")
    (tmp_path / "sub" / "c.md").write_text("")                          # empty
    (tmp_path / "bad.md").write_bytes(b"line one\nline two \xff\n")     # invalid UTF-8, line 2
    (tmp_path / "yaml.md").write_text("---\ntitle: [unclosed\n---\nbody\n")  # broken YAML
    report = LoadReport()
    docs = {d.id: d for d in iter_markdown(tmp_path, report, LIMIT)}
    assert sorted(docs) == ["a.md", "sub/b.md"]
    a = docs["a.md"]
    assert a.title == "Heap sizing"
    assert a.meta == {"tags": ["jvm", "memory"], "date": "2026-01-02"}
    assert "pointers (Compressed oops)" in a.text and "see" in a.text and "GC." in a.text
    assert "[[" not in a.text
    assert docs["sub/b.md"].title == "Snapshots"
    problems = {Path(p.file).name: p for p in report.problems}
    assert sorted(problems) == ["bad.md", "c.md", "yaml.md"]
    assert problems["bad.md"].line == 2 and "invalid UTF-8" in problems["bad.md"].reason
    assert "front matter" in problems["yaml.md"].reason
    assert report.loaded == 2 and report.skipped == 3


def test_unknown_layout_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="neither a BEIR folder"):
        iter_corpus(tmp_path, LoadReport(), LIMIT)
    with pytest.raises(CorpusError, match="no such file"):
        iter_corpus(tmp_path / "missing.jsonl", LoadReport(), LIMIT)
