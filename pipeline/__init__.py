"""sira-pipeline: LLM-enriched lexical retrieval for Elasticsearch and OpenSearch.

The Python API is the one the CLI and the bench use::

    from pipeline import Settings, search
    from pipeline.local import connect
    settings = Settings()  # SIRA_* variables; no SIRA_ENGINE__URL: the local engine
    result = search(connect(settings), settings, "why is my cluster yellow")
"""

from pipeline.config import Settings
from pipeline.engine import Engine
from pipeline.query import Hit, SearchResult, search

__all__ = ["Engine", "Hit", "SearchResult", "Settings", "search"]
