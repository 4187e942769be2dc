"""The package as code: importing it has no side effects. No engine needed."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pipeline


def test_importing_any_module_writes_nothing(tmp_path: Path) -> None:
    names = [f"pipeline.{m.name}" for m in pkgutil.iter_modules(pipeline.__path__)]
    assert {"pipeline.cli", "pipeline.worker", "pipeline.bench"} <= set(names)
    home = tmp_path / "home"
    home.mkdir()
    code = "import importlib, sys\nfor name in sys.argv[1:]: importlib.import_module(name)"
    subprocess.run([sys.executable, "-c", code, *names], cwd=tmp_path, check=True,
                   env={"HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert [p.name for p in tmp_path.iterdir()] == ["home"]
    assert list(home.iterdir()) == []
