"""Real engines for the tests, started with the same code as `sira engine start`.

A missing engine is an error, never a skip: the fixtures start what they need (fetching it
with mvn the first time). Set SIRA_TEST_KEEP_ENGINES=1 to leave them running between runs.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import local
from pipeline.config import IndexSettings, Settings
from pipeline.engine import Engine
from pipeline.local import servers

STATE_DIR = Path(os.environ.get("SIRA_TEST_STATE_DIR")
                 or Path(tempfile.gettempdir()) / "sira-test-state")
KEEP = os.environ.get("SIRA_TEST_KEEP_ENGINES") == "1"
# the proposal cache outlives indices (and test runs on kept engines): tests that are not about
# it turn it off, so a text proposed for in one test is not restored in another
os.environ["SIRA_ENRICH__CACHE_INDEX"] = ""

# name -> start() arguments. Elasticsearch runs with TLS and basic auth, so every test on it
# also exercises certificate verification and credentials.
ENGINES = {
    "opensearch": dict(kind="opensearch"),
    "elasticsearch": dict(kind="elasticsearch", security=True),
    "opensearch-3nodes": dict(kind="opensearch", nodes=3),
}


class EngineFarm:
    """Starts each engine once per session (or finds it running) and remembers which ones it
    started, to stop them at the end."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.settings = Settings(state_dir=STATE_DIR)

    def engine(self, name: str) -> Engine:
        full = f"test-{name}"
        existing = servers.load_record(STATE_DIR, full)
        if existing is None or not servers.is_running(existing):
            self.started.append(full)
        servers.start(name=full, state_dir=STATE_DIR, **ENGINES[name])
        return local.connect(self.settings, local_name=full)

    def stop_started(self) -> None:
        for name in self.started:
            servers.stop(STATE_DIR, name)


@pytest.fixture(scope="session")
def farm() -> Iterator[EngineFarm]:
    farm = EngineFarm()
    yield farm
    if not KEEP:
        farm.stop_started()


def _serve(farm: EngineFarm, name: str) -> Iterator[Engine]:
    client = farm.engine(name)
    yield client
    client.close()


@pytest.fixture(scope="session", params=["opensearch", "elasticsearch"])
def engine(request: pytest.FixtureRequest, farm: EngineFarm) -> Iterator[Engine]:
    """Each engine-behaviour test runs once on OpenSearch and once on Elasticsearch."""
    yield from _serve(farm, request.param)


# one-value params: the engine a test ran on shows in its id ([opensearch], [opensearch-3],
# [elasticsearch]) like the two-engine tests' ids do
@pytest.fixture(scope="session", params=["opensearch"])
def opensearch(request: pytest.FixtureRequest, farm: EngineFarm) -> Iterator[Engine]:
    yield from _serve(farm, request.param)


@pytest.fixture(scope="session", params=["elasticsearch"])
def elasticsearch(request: pytest.FixtureRequest, farm: EngineFarm) -> Iterator[Engine]:
    yield from _serve(farm, request.param)


@pytest.fixture(scope="session", params=["opensearch-3"])
def cluster(farm: EngineFarm) -> Iterator[Engine]:
    """A real 3-node OpenSearch cluster."""
    yield from _serve(farm, "opensearch-3nodes")


@pytest.fixture
def index_settings() -> Iterator[IndexSettings]:
    """A fresh index name per test; the test's engine fixture deletes it afterwards."""
    yield IndexSettings(name=f"test-{uuid.uuid4().hex[:10]}")


@pytest.fixture
def fresh_index(engine: Engine, index_settings: IndexSettings) -> Iterator[IndexSettings]:
    engine.create_index(index_settings)
    yield index_settings
    engine.delete_index(index_settings.name)
