"""The offline batch path: corpus-side requests written as a ``vllm run-batch`` input file, and
proposals read back — from that tool's output file or from plain JSONL
``{"doc_id", "terms": [...]}`` — and stored exactly as the online path stores them."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import enrich
from pipeline.config import Settings
from pipeline.engine import Engine, ItemFailure
from pipeline.llm import BadAnswer, chat_request, parse_keywords
from pipeline.loaders import LoadReport, iter_jsonl_objects
from pipeline.prompts import document_body
from pipeline.schema import Layout


def export_batch(engine: Engine, settings: Settings, path: Path, *, all_docs: bool = False
                 ) -> int:
    """One OpenAI batch line per document that needs proposals (or every document)."""
    prompt = enrich.prompt_for(settings)
    llm = settings.llm
    layout = Layout.of(engine.get_meta(settings.index.name))
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for hit in engine.scan(settings.index.name, source=layout.read()):
            source = hit["_source"]
            if not all_docs and not enrich.needs_proposals(source, prompt.version, layout):
                continue
            body = document_body(*layout.title_text(source))
            line = {"custom_id": hit["_id"], "method": "POST", "url": "/v1/chat/completions",
                    "body": chat_request(llm, prompt, body)}
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
            count += 1
    return count


@dataclass
class ImportSummary:
    lines: int = 0
    stored: int = 0
    failed_answers: int = 0
    report: LoadReport = field(default_factory=LoadReport)
    refused: list[ItemFailure] = field(default_factory=list)  # proposals the engine refused
    rejected: list[ItemFailure] = field(default_factory=list)  # not even recorded as failed

    def line(self) -> str:
        return (f"{self.lines} lines: {self.stored} documents stored, {self.failed_answers} "
                f"recorded as failed ({len(self.refused)} of them refused by the engine), "
                f"{self.report.skipped} lines skipped"
                + (f", {len(self.rejected)} rejected by the engine" if self.rejected else ""))


@dataclass
class _Line:
    lineno: int
    doc_id: str
    terms: list[str] | None
    reason: str | None
    model: str | None
    prompt: str | None


def _parse(lineno: int, obj: dict) -> _Line:
    """A plain ``{"doc_id", "terms"}`` line or a ``vllm run-batch`` output line."""
    if "custom_id" in obj:
        doc_id = str(obj["custom_id"])
        response = obj.get("response") or {}
        if obj.get("error") or response.get("status_code", 200) != 200:
            reason = obj.get("error") or f"HTTP {response.get('status_code')}"
            return _Line(lineno, doc_id, None, f"batch request failed: {reason}", None, None)
        body = response.get("body") or {}
        try:
            choice = body["choices"][0]
            words = parse_keywords(choice["message"].get("content"), choice.get("finish_reason"))
        except (KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"malformed batch output: missing {exc}") from exc
        except BadAnswer as exc:
            return _Line(lineno, doc_id, None, str(exc), body.get("model"), None)
        return _Line(lineno, doc_id, words, None, body.get("model"), None)
    if "doc_id" not in obj or not isinstance(obj.get("terms"), list):
        raise ValueError('expected {"doc_id", "terms": [...]} or a run-batch output line')
    if not all(isinstance(t, str) for t in obj["terms"]):
        raise ValueError('"terms" must be a list of strings')
    return _Line(lineno, str(obj["doc_id"]), obj["terms"], None, obj.get("model"),
                 obj.get("prompt"))


def import_proposals(engine: Engine, settings: Settings, path: Path, *,
                     model: str | None = None, prompt_version: str | None = None,
                     batch: int = 500) -> ImportSummary:
    """Store recorded proposals. Unknown document ids and malformed lines are reported with
    their line number; failed answers are recorded on their documents."""
    index = settings.index.name
    prompt = enrich.prompt_for(settings)
    layout = Layout.of(engine.get_meta(index))
    summary = ImportSummary()
    pending: list[_Line] = []

    def flush() -> None:
        sources = engine.mget(index, [x.doc_id for x in pending], source=layout.read())
        groups: dict[tuple[str, str], dict[str, list[str]]] = {}
        failures: dict[str, str] = {}
        for x in pending:
            if x.doc_id not in sources:
                summary.report.skip(path, x.lineno, x.doc_id, "unknown document id")
                continue
            if x.terms is None:
                failures[x.doc_id] = x.reason or "failed"
                continue
            key = (model or x.model or "imported", prompt_version or x.prompt or prompt.version)
            groups.setdefault(key, {})[x.doc_id] = x.terms
        for (line_model, line_prompt), proposals in groups.items():
            result = enrich.store_proposals(engine, index, proposals, sources, model=line_model,
                                            prompt_version=line_prompt, stance=prompt.stance,
                                            layout=layout)
            summary.stored += result.ok
            # proposals the engine refuses fail their document, named, as in the online path
            summary.refused += result.failures
            failures |= {f.id: f"engine rejected the proposals: {f.reason}"
                         for f in result.failures}
        failed = enrich.record_failures(engine, index, failures, sources)
        summary.failed_answers += failed.ok
        summary.rejected += failed.failures
        pending.clear()

    seen: Counter[str] = Counter()
    for lineno, obj in iter_jsonl_objects(path, summary.report):
        summary.lines += 1
        try:
            line = _parse(lineno, obj)
        except ValueError as exc:
            summary.report.skip(path, lineno, None, str(exc))
            continue
        seen[line.doc_id] += 1
        if seen[line.doc_id] > 1:
            summary.report.skip(path, lineno, line.doc_id, "document appears twice; first kept")
            continue
        pending.append(line)
        if len(pending) >= batch:
            flush()
    if pending:
        flush()
    engine.refresh(index)
    summary.report.loaded = summary.stored
    return summary
