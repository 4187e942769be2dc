"""What runs on this machine: local search engines (``servers``), local Celery workers
(``workers``), and finding the engine a command should talk to (``connect``). The engine
adapter (``pipeline.engine``) knows nothing of them."""

from __future__ import annotations

from pydantic import SecretStr

from pipeline.config import Settings
from pipeline.engine import Engine, EngineUnavailable


def connect(settings: Settings, local_name: str = "local") -> Engine:
    """The configured engine (``SIRA_ENGINE__URL``), or else the local one ``sira engine
    start`` recorded under ``local_name``."""
    if settings.engine.url:
        return Engine.connect(settings.engine)
    from pipeline.local import servers

    record = servers.load_record(settings.state_dir, local_name)
    if record is None:
        raise EngineUnavailable(
            "no engine configured: set SIRA_ENGINE__URL (and SIRA_ENGINE__KIND), "
            f"or start a local one with `sira engine start --name {local_name}`"
        )
    if not servers.is_running(record):
        raise EngineUnavailable(
            f"the local engine '{local_name}' recorded at {record.url} is not running "
            f"(process {record.pid} is gone): start it with `sira engine start --name "
            f"{local_name}`")
    local = settings.engine.model_copy(
        update={"kind": record.kind, "url": record.url, "username": record.username,
                "password": SecretStr(record.password) if record.password else None,
                "ca_file": record.ca_file}
    )
    return Engine.connect(local)
