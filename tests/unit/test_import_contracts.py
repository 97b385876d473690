"""The import contracts (pyproject.toml, checked by lint-imports in `make test`) catch a planted
violation of every kind: a copy of the code base with one bad import per contract is refused,
each contract named BROKEN."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ndstore", "blaze", "lambdas", "benchmarks")
PLANTED = {  # contract (start of its name) -> (module to add, its one import)
    "Layers point one way": ("ndstore/core/_planted_layer.py", "import ndstore.engine.volume"),
    "No adapter above the wiring": ("ndstore/api/_planted_adapter.py", "from ndstore.storage import s3"),
    "No import cycles between sibling modules": ("benchmarks/_planted_a.py", "import benchmarks._planted_b"),
    "Nothing below the api imports Django": ("ndstore/engine/_planted_django.py", "import django"),
    "The engine and NDBlaze see storage through its ports only": ("blaze/_planted_adapter.py",
                                                                    "from ndstore.storage import redis_cache"),
    "The client is what a user imports": ("ndstore/client/_planted.py", "import boto3"),
    "The core is pure": ("ndstore/core/_planted_redis.py", "import redis"),
    "The contract suites and fakes are for tests": ("ndstore/engine/_planted_testing.py",
                                                    "import ndstore.testing.memory"),
    "The contract suites know the ports": ("ndstore/testing/_planted_adapter.py", "from ndstore.storage import s3"),
}
ALSO = {"benchmarks/_planted_b.py": "import benchmarks._planted_a",  # the other half of the cycle
        "ndstore/engine/_planted_config.py": "import ndstore.config"}  # the settings are passed in, not read


def test_every_contract_refuses_a_planted_violation(tmp_path: Path) -> None:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "results"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for path, line in [*PLANTED.values(), *ALSO.items()]:
        (tmp_path / path).write_text(f'"""Planted by the test."""\n{line}\n')
    result = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
                            timeout=300)
    report = " ".join(result.stdout.split())  # contract names are wrapped over lines
    assert result.returncode != 0, report[-2000:]
    for contract in PLANTED:
        assert f"{contract}" in report and "BROKEN" in report.split(contract, 1)[1][:400], (contract, report[-3000:])
    assert "ndstore.engine._planted_config" in report  # the config is above the engine's layer
