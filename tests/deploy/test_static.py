"""Static checks of the deployment files (no Docker engine runs on our machines): they parse,
they refer only to settings the code reads, and to files that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SETTING_SOURCES = ["ndstore/config.py", "ndstore/api/settings/base.py", "ndstore/api/settings/production.py",
                   "deploy/gunicorn.conf.py", "ndstore/api/management/commands/ndstore_prepare.py"]
# Read by libraries (boto3, Django, glibc), not by our code.
EXTERNAL = {"DATABASE_URL", "DJANGO_SETTINGS_MODULE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
            "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"}


def settings_read_by_code() -> set[str]:
    text = "".join((ROOT / p).read_text() for p in SETTING_SOURCES)
    return set(re.findall(r"NDSTORE_[A-Z0-9_]+", text))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def test_compose_services_are_complete(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"nginx", "web", "migrate", "redis", "minio", "dynamodb", "postgres"} <= set(services)
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        deps = svc.get("depends_on", [])
        assert set(deps) <= set(services), (name, deps)


def test_compose_uses_only_settings_the_code_reads(compose: dict[str, Any]) -> None:
    known = settings_read_by_code() | EXTERNAL
    for name in ("web", "migrate"):
        env = compose["services"][name]["environment"]
        unknown = {k for k in env if k not in known}
        assert not unknown, f"{name} sets settings nothing reads: {unknown}"


def test_compose_mounts_exist(compose: dict[str, Any]) -> None:
    for svc in compose["services"].values():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source


def test_dockerfile_runs_gunicorn_as_non_root() -> None:
    lines = [ln.strip() for ln in (ROOT / "Dockerfile").read_text().splitlines() if ln.strip()]
    assert next(ln for ln in lines if not ln.startswith("#")).startswith("FROM ")
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    cmd = next(ln for ln in lines if ln.startswith("CMD "))
    assert "deploy/gunicorn.conf.py" in cmd
    for env in re.findall(r"(NDSTORE_[A-Z0-9_]+)=", (ROOT / "Dockerfile").read_text()):
        assert env in settings_read_by_code()


def _nginx_text() -> str:
    return (ROOT / "deploy" / "nginx.conf").read_text()


def test_nginx_routes_by_prefix() -> None:
    text = _nginx_text()
    assert text.count("{") == text.count("}")
    assert re.search(r"upstream web\s*{", text)
    for prefix in ("/v1/blaze/", "/v1/ingest/", "/v1/", "/"):
        assert re.search(rf"location {re.escape(prefix)}\s*{{", text), prefix
    assert "client_max_body_size 1g" in text


def test_nginx_accepts_the_config(tmp_path: Path) -> None:
    nginx = shutil.which("nginx")
    if nginx is None:
        pytest.skip("nginx is not installed here; the syntax check runs where it is")
    conf = tmp_path / "nginx.conf"
    local = _nginx_text().replace("server web:8000", "server 127.0.0.1:8000")
    conf.write_text(local.replace("listen 80", "listen 127.0.0.1:18080"))
    result = subprocess.run([nginx, "-t", "-c", str(conf), "-p", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
