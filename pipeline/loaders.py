"""Corpus readers: JSONL, BEIR folders and folders of Markdown notes.

Every reader yields ``Document``s and records each input it cannot use in a ``LoadReport``
(file, line, document id, reason) instead of raising: one bad line never stops a load, and
nothing is dropped without a trace.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import frontmatter
import yaml

from pipeline.schema import PENDING, content_hash

KNOWN_FIELDS = {"_id", "title", "text"}
WIKILINK = re.compile(r"\[\[([^\]|#]+)(?:#[^\]|]*)?(?:\|([^\]]+))?\]\]")


@dataclass
class Document:
    id: str
    title: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict)
    source_path: str | None = None

    @property
    def content_hash(self) -> str:
        return content_hash(self.title, self.text)

    def to_index(self) -> dict:
        """The stored form of a loaded document (status pending); enrichment comes later."""
        body: dict = {"_id": self.id, "title": self.title, "text": self.text,
                      "sira": {"content_hash": self.content_hash, "status": PENDING,
                               "indexed_at": now_iso()}}
        if self.meta:
            body["meta"] = self.meta
        if self.source_path:
            body["source_path"] = self.source_path
        return body


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass
class LoadProblem:
    file: str
    line: int | None
    doc_id: str | None
    reason: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        who = f" (document {self.doc_id})" if self.doc_id else ""
        return f"{where}{who}: {self.reason}"


@dataclass
class LoadReport:
    loaded: int = 0
    problems: list[LoadProblem] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return len(self.problems)

    def skip(self, file: Path | str, line: int | None, doc_id: str | None, reason: str) -> None:
        self.problems.append(LoadProblem(str(file), line, doc_id, reason))


class CorpusError(ValueError):
    """The input as a whole cannot be read (missing file, unknown layout)."""


def _check(doc: Document, max_doc_bytes: int) -> str | None:
    """Why ``doc`` cannot be indexed, or None."""
    if not doc.title.strip() and not doc.text.strip():
        return "empty document (no title and no text)"
    size = len(doc.title.encode()) + len(doc.text.encode())
    if size > max_doc_bytes:
        return f"document too large: {size} bytes > limit {max_doc_bytes}"
    return None


def _first_bad_utf8_line(data: bytes, error: UnicodeDecodeError) -> int:
    return data.count(b"\n", 0, error.start) + 1


def _jsonable(value: Any) -> Any:
    """Front matter values as JSON (YAML dates become ISO strings)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return value


# -- JSONL ---------------------------------------------------------------------------------


def iter_jsonl_objects(path: Path, report: LoadReport) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each usable line; bad lines are recorded in ``report``."""
    with open(path, "rb") as fh:
        if fh.read(64).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
            raise CorpusError(f"{path}: a JSON array, not JSON Lines: write one JSON object per "
                              f"line (for example: jq -c '.[]' {path})")
        fh.seek(0)
        for lineno, raw in enumerate(fh, start=1):
            if lineno == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                report.skip(path, lineno, None, f"invalid UTF-8 at byte {exc.start}")
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                report.skip(path, lineno, None, f"broken JSON: {exc.msg} at column {exc.colno}")
                continue
            if not isinstance(obj, dict):
                report.skip(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}")
                continue
            yield lineno, obj


def iter_jsonl(path: Path, report: LoadReport, max_doc_bytes: int) -> Iterator[Document]:
    """Documents from JSONL lines ``{"_id", "title", "text", ...}``; other keys go to meta."""
    seen: dict[str, int] = {}
    for lineno, obj in iter_jsonl_objects(path, report):
        raw_id = obj.get("_id")
        if raw_id is None or (isinstance(raw_id, str) and not raw_id.strip()):
            report.skip(path, lineno, None, 'missing "_id"')
            continue
        if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
            report.skip(path, lineno, None, f'"_id" must be a string, got {type(raw_id).__name__}')
            continue
        doc_id = str(raw_id)
        title, text = obj.get("title", "") or "", obj.get("text", "") or ""
        if not isinstance(title, str) or not isinstance(text, str):
            report.skip(path, lineno, doc_id, '"title" and "text" must be strings')
            continue
        if doc_id in seen:
            report.skip(path, lineno, doc_id, f"duplicate id, first seen at line {seen[doc_id]}")
            continue
        meta = {k: v for k, v in obj.items() if k not in KNOWN_FIELDS}
        doc = Document(doc_id, title, text, meta, f"{path}:{lineno}")
        if reason := _check(doc, max_doc_bytes):
            report.skip(path, lineno, doc_id, reason)
            continue
        seen[doc_id] = lineno
        report.loaded += 1
        yield doc


# -- BEIR ----------------------------------------------------------------------------------


def is_beir_folder(path: Path) -> bool:
    return path.is_dir() and (path / "corpus.jsonl").is_file()


def load_queries(path: Path, report: LoadReport | None = None) -> dict[str, str]:
    """BEIR queries.jsonl: ``{"_id", "text"}`` per line."""
    report = report or LoadReport()
    queries: dict[str, str] = {}
    for lineno, obj in iter_jsonl_objects(path, report):
        qid, text = obj.get("_id"), obj.get("text")
        if qid is None or not isinstance(text, str) or not text.strip():
            report.skip(path, lineno, None if qid is None else str(qid), "query needs _id and text")
            continue
        queries[str(qid)] = text
        report.loaded += 1
    return queries


def load_phrasings(path: Path) -> dict[str, list[str]]:
    """Alternative phrasings a collection may supply in queries.jsonl: ``"also": [...]``."""
    out: dict[str, list[str]] = {}
    for _, obj in iter_jsonl_objects(path, LoadReport()):
        also = obj.get("also")
        if obj.get("_id") is not None and isinstance(also, list):
            out[str(obj["_id"])] = [a for a in also if isinstance(a, str) and a.strip()]
    return out


def load_qrels(path: Path, report: LoadReport | None = None) -> dict[str, dict[str, int]]:
    """BEIR qrels TSV with a header ``query-id corpus-id score``."""
    report = report or LoadReport()
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8", newline="") as fh:
        for lineno, row in enumerate(csv.reader(fh, delimiter="\t"), start=1):
            if not row or (lineno == 1 and row[0] == "query-id"):
                continue
            try:
                qid, did, score = row[0], row[1], int(row[2])
            except (IndexError, ValueError):
                report.skip(path, lineno, None, f"expected query-id, corpus-id, score: {row!r}")
                continue
            qrels.setdefault(qid, {})[did] = score
    return qrels


def beir_split(folder: Path, split: str) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """Queries and qrels of one split (``qrels/<split>.tsv``); only judged queries."""
    qrels_file = folder / "qrels" / f"{split}.tsv"
    if not (folder / "queries.jsonl").is_file():
        raise CorpusError(f"{folder}: no queries.jsonl (a BEIR folder has corpus.jsonl, "
                          "queries.jsonl and qrels/<split>.tsv)")
    if not qrels_file.is_file():
        available = sorted(p.stem for p in (folder / "qrels").glob("*.tsv"))
        raise CorpusError(f"{folder}: no qrels for split '{split}' (have: {available})")
    qrels = load_qrels(qrels_file)
    queries = load_queries(folder / "queries.jsonl")
    return {q: t for q, t in queries.items() if q in qrels}, qrels


# -- Markdown ------------------------------------------------------------------------------


def _markdown_text(body: str) -> str:
    """Note body with ``[[target|alias]]`` kept as words: ``alias target`` (or ``target``)."""

    def words(match: re.Match) -> str:
        target, alias = match.group(1).strip(), (match.group(2) or "").strip()
        return f"{alias} ({target})" if alias and alias != target else target

    return WIKILINK.sub(words, body)


def _front_matter_kind(content: str) -> str | None:
    """What a note's front matter holds when it is not a mapping (python-frontmatter then
    silently gives no metadata), e.g. "a list"; None when it is a mapping or absent."""
    handler = frontmatter.YAMLHandler()
    if not handler.detect(content):
        return None
    data = yaml.safe_load(handler.split(content)[0])
    if data is None or isinstance(data, dict):
        return None
    return "a list" if isinstance(data, list) else f"a {type(data).__name__}"


def iter_markdown(folder: Path, report: LoadReport, max_doc_bytes: int) -> Iterator[Document]:
    """One document per ``*.md`` file: id = path relative to ``folder``; YAML front matter
    becomes fields (``title``) and meta; title falls back to the first heading, then the
    file name."""
    for path in sorted(folder.rglob("*.md")):
        doc_id = path.relative_to(folder).as_posix()
        data = path.read_bytes()
        try:
            content = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            report.skip(path, _first_bad_utf8_line(data, exc), doc_id,
                        f"invalid UTF-8 at byte {exc.start}")
            continue
        try:
            post = frontmatter.loads(content)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 2 if mark is not None else 1  # +1 for the opening ---
            report.skip(path, line, doc_id, f"broken YAML front matter: {exc}")
            continue
        if not post.metadata and (kind := _front_matter_kind(content)):
            report.skip(path, 2, doc_id, f"YAML front matter must be key: value pairs, got {kind}")
            continue
        meta = _jsonable(dict(post.metadata))
        title = str(meta.pop("title", "") or "")
        body = post.content
        if not body.strip() and not title:
            report.skip(path, None, doc_id, "empty document (no title and no text)")
            continue
        if not title:
            heading = re.search(r"^#\s+(.+)$", body, flags=re.MULTILINE)
            title = heading.group(1).strip() if heading else path.stem
        doc = Document(doc_id, title, _markdown_text(body), meta, str(path))
        if reason := _check(doc, max_doc_bytes):
            report.skip(path, None, doc_id, reason)
            continue
        report.loaded += 1
        yield doc


# -- dispatch ------------------------------------------------------------------------------


def iter_corpus(path: Path, report: LoadReport, max_doc_bytes: int) -> Iterator[Document]:
    """Documents from a JSONL file, a BEIR folder or a folder of Markdown notes."""
    if path.is_file():
        return iter_jsonl(path, report, max_doc_bytes)
    if is_beir_folder(path):
        return iter_jsonl(path / "corpus.jsonl", report, max_doc_bytes)
    if path.is_dir():
        if not any(path.rglob("*.md")):
            raise CorpusError(f"{path}: neither a BEIR folder (corpus.jsonl) nor Markdown notes")
        return iter_markdown(path, report, max_doc_bytes)
    raise CorpusError(f"{path}: no such file or folder")


def count_items(path: Path) -> int | None:
    """How many documents ``path`` holds at most (non-empty lines or Markdown files), for a
    progress bar; None when unknown."""
    if path.is_dir() and not is_beir_folder(path):
        return sum(1 for _ in path.rglob("*.md"))
    file = path / "corpus.jsonl" if path.is_dir() else path
    if not file.is_file():
        return None
    with open(file, "rb") as fh:
        return sum(1 for line in fh if line.strip())
