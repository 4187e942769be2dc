"""Corpus-side and query-side prompts. Each prompt has a version id — a hash of its text and
parameters — stored with everything it produced, so a changed prompt is detectable and a
document is re-proposed only when its text or its prompt changed."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from pipeline.config import Stance

CORPUS_SYSTEM = (
    "You index documents for a keyword search engine. For the document you are given, list "
    "the words and short phrases a person would type into a search box when this document is "
    "the one they need, and that would single it out from other documents."
)

CORPUS_RULES = {
    "new": (
        "Use only vocabulary that does NOT already appear in the document: other names for its "
        "subject, abbreviations and their expansions, the roles and categories it belongs to, "
        "related named entities, the everyday words for its technical terms."
    ),
    "new+key": (
        "Use both kinds of vocabulary: (a) the document's own most distinctive terms and "
        "phrases, exactly as a searcher would type them, and (b) vocabulary that does not "
        "appear in it: other names for its subject, abbreviations and their expansions, the "
        "roles and categories it belongs to, related named entities, everyday words for its "
        "technical terms."
    ),
}

CORPUS_COMMON = (
    "Be specific. Leave out broad topic words that would fit thousands of documents "
    "(such as 'research', 'study', 'health', 'system'). Give at most {max_terms} entries, each "
    "of 1 to {max_n} words. Answer with a JSON object only: {{\"keywords\": [\"...\", ...]}}."
)

QUERY_SYSTEM = (
    "You help a keyword search engine find the document that answers a question. You do not "
    "answer the question."
)

QUERY_RULES = (
    "Write the vocabulary that the answering document would contain but the question does not: "
    "technical terms, their synonyms and abbreviations, the names of methods, measurements and "
    "categories, one entry per distinct aspect of the question. Never guess the answer itself: "
    "no guessed names, numbers, dates or places. Give at most {max_terms} entries, each of 1 to "
    "{max_n} words. Answer with a JSON object only: {{\"keywords\": [\"...\", ...]}}."
)

STRICT_REMINDER = (
    "Your previous answer was not the requested JSON. Reply again with exactly one JSON object "
    "of the form {\"keywords\": [\"...\"]} and nothing before or after it."
)


def keywords_schema(max_terms: int) -> dict:
    return {
        "type": "object",
        "properties": {
            "keywords": {"type": "array", "items": {"type": "string"}, "maxItems": max_terms}
        },
        "required": ["keywords"],
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class Prompt:
    kind: str  # "corpus" or "query"
    stance: str
    system: str
    instructions: str
    max_terms: int
    max_n: int
    input_chars: int

    @property
    def version(self) -> str:
        text = json.dumps([self.kind, self.stance, self.system, self.instructions,
                           self.max_terms, self.max_n, self.input_chars])
        return f"{self.kind}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"

    @property
    def schema(self) -> dict:
        return keywords_schema(self.max_terms)

    def messages(self, body: str) -> list[dict[str, str]]:
        """Chat messages for one input (a document or a query)."""
        return [
            {"role": "system", "content": self.system},
            {"role": "user", "content": f"{self.instructions}\n\n{body[: self.input_chars]}"},
        ]

    def raw(self, body: str) -> str:
        """One plain-text prompt, for /v1/completions."""
        chat = self.messages(body)
        return f"{chat[0]['content']}\n\n{chat[1]['content']}\n\nJSON:"


def corpus_prompt(stance: Stance, max_terms: int, max_n: int, doc_chars: int) -> Prompt:
    instructions = CORPUS_RULES[stance] + " " + CORPUS_COMMON.format(
        max_terms=max_terms, max_n=max_n)
    return Prompt("corpus", stance, CORPUS_SYSTEM, instructions, max_terms, max_n, doc_chars)


def query_prompt(max_terms: int, max_n: int, query_chars: int = 1000) -> Prompt:
    instructions = QUERY_RULES.format(max_terms=max_terms, max_n=max_n)
    return Prompt("query", "sketch", QUERY_SYSTEM, instructions, max_terms, max_n, query_chars)


def document_body(title: str, text: str) -> str:
    return f"Title: {title}\n\n{text}" if title else text
