"""Shared fixtures: real servers on loopback, each started and stopped by its fixture.

- moto's server (one request at a time, see ndstore/ops/moto_endpoint.py): S3, SQS, DynamoDB
  and Lambda over real HTTP, one per test session.
- redis-server: its own free port and data directory, one per test session (and another for
  the NDBlaze buffer).
- a SparkSession in local mode, one per test session, for the NDBlaze merge job; and a Spark
  standalone master and worker (their own JVMs, free ports), for the scale-out path.
- three redis-server processes joined into a Redis Cluster, for the cache tier's scale-out path.
The Django service is wired to both (NDSTORE_OBJECT_STORE=s3, NDSTORE_INDEX=dynamodb,
NDSTORE_LOCKS=redis), so API tests exercise the real adapters end to end.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request

# Credentials for moto only; set before any boto3 client exists. Never reaches AWS.
os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
os.environ.pop("AWS_PROFILE", None)

ROOT = Path(__file__).resolve().parents[1]

# What starts a server (or a JVM): a test that needs one is marked `servers`, and `make check`,
# the fast lane, leaves it to `make test`. A fixture parametrized over backends names one of
# these in its param when it asks for the fixture inside (request.getfixturevalue).
SERVER_FIXTURES = frozenset({"moto_endpoint", "redis_url", "blaze_redis_url", "spark", "service_env",
                             "redis_cluster_url", "spark_standalone", "spark_master_url", "ingest_env"})
SERVER_PARAMS = frozenset({"redis", "cluster", "moto", "s3", "dynamodb", "sqs"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "servers: starts a real server or JVM; `make check` runs without them")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())) or SERVER_PARAMS.intersection(
                str(value) for value in params.values()):
            item.add_marker(pytest.mark.servers)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` (`make test`): files sharing an expensive fixture in one worker, the
    longest first (tests/scheduling.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.scheduling import make_scheduler

    return make_scheduler(config, log)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from ndstore.ops.moto_endpoint import SerialMotoServer

    server = SerialMotoServer().start()
    yield server.url
    server.stop()


def _redis_server(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[str]:
    from ndstore.ops.localstack import free_port, start_redis

    port = free_port()
    proc = start_redis(tmp_path_factory.mktemp(name), port)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The locks' and the cache tier's redis-server."""
    yield from _redis_server(tmp_path_factory, "redis")


@pytest.fixture(scope="session")
def blaze_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The NDBlaze buffer's own redis-server, as in a deployment."""
    yield from _redis_server(tmp_path_factory, "blaze-redis")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One SparkSession in local mode for the whole test session (it takes seconds to start)."""
    from blaze.spark_job import spark_session

    session = spark_session("local[2]", "ndstore-tests")
    yield session
    session.stop()
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its __del__ logs after pytest closed the streams


# What `service_env` puts in this process's environment for the whole session: a LocalStack
# started later in the same process inherits os.environ, so a test's stack unsets these
# (`own_stack_env`) or it would share the session's moto bucket and index (two stacks' channel
# 1/1/1 then meet in one object: "stored supercuboid has dtype uint8, channel has uint16").
# (The stack sets its Redis URLs, data directory and secret key itself: not unset.)
SERVICE_ENV_KEYS = ("NDSTORE_OBJECT_STORE", "NDSTORE_S3_ENDPOINT_URL", "NDSTORE_S3_BUCKET", "NDSTORE_INDEX",
                    "NDSTORE_DYNAMODB_ENDPOINT_URL", "NDSTORE_DYNAMODB_TABLE", "NDSTORE_LOCKS",
                    "NDSTORE_MAX_BODY_BYTES", "NDSTORE_MAX_CUTOUT_BYTES")
_SET_BY_THE_STACK = {"NDSTORE_REDIS_URL", "NDSTORE_BLAZE_REDIS_URL", "NDSTORE_DATA_DIR", "NDSTORE_SECRET_KEY"}


def own_stack_env(extra_env: dict[str, str] | None = None) -> dict[str, str | None]:
    """A test LocalStack's extra_env: the session's `service_env` settings unset, then ``extra_env``."""
    return {**dict.fromkeys(SERVICE_ENV_KEYS), **(extra_env or {})}


@pytest.fixture(scope="session")
def service_env(
    moto_endpoint: str, redis_url: str, blaze_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """Point the service's wiring at moto (S3 + DynamoDB) and the test Redis."""
    from ndstore import wiring

    env = {
        "NDSTORE_OBJECT_STORE": "s3",
        "NDSTORE_S3_ENDPOINT_URL": moto_endpoint,
        "NDSTORE_S3_BUCKET": "ndstore-test-cuboids",
        "NDSTORE_INDEX": "dynamodb",
        "NDSTORE_DYNAMODB_ENDPOINT_URL": moto_endpoint,
        "NDSTORE_DYNAMODB_TABLE": "ndstore-test-index",
        "NDSTORE_LOCKS": "redis",
        "NDSTORE_REDIS_URL": redis_url,
        "NDSTORE_BLAZE_REDIS_URL": blaze_redis_url,
        "NDSTORE_DATA_DIR": str(tmp_path_factory.mktemp("data")),
        "NDSTORE_SECRET_KEY": "test-secret-key-of-the-suite-only",
        "NDSTORE_MAX_BODY_BYTES": str(64 << 20),
        "NDSTORE_MAX_CUTOUT_BYTES": str(256 << 20),
    }
    assert set(env) == set(SERVICE_ENV_KEYS) | _SET_BY_THE_STACK, "own_stack_env must unset what this sets"
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    wiring.services.cache_clear()
    yield env
    wiring.services.cache_clear()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Three redis-server processes on loopback joined into a Redis Cluster (no replicas)."""
    import shutil

    from ndstore.ops.localstack import free_port

    def _port_free(port: int) -> bool:
        import socket

        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) != 0

    cli, server = shutil.which("redis-cli"), shutil.which("redis-server")
    if cli is None or server is None:
        pytest.skip("redis-server/redis-cli are not installed")
    ports: list[int] = []
    while len(ports) < 3:  # the cluster bus listens on port + 10000, which must exist and be free
        port = free_port()
        if port + 10000 < 65536 and _port_free(port + 10000):
            ports.append(port)
    procs = []
    for port in ports:
        d = tmp_path_factory.mktemp(f"cluster{port}")
        procs.append(subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes", "--dir", str(d),
             "--cluster-config-file", "nodes.conf", "--appendonly", "yes", "--save", ""],
            stdout=subprocess.DEVNULL))
    try:
        for port in ports:
            for _ in range(100):
                if subprocess.run([cli, "-p", str(port), "ping"], capture_output=True).returncode == 0:
                    break
                time.sleep(0.05)
        subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports], "--cluster-replicas", "0",
                        "--cluster-yes"], check=True, capture_output=True, timeout=60)
        for _ in range(200):
            out = subprocess.run([cli, "-p", str(ports[0]), "cluster", "info"], capture_output=True, text=True)
            if "cluster_state:ok" in out.stdout:
                break
            time.sleep(0.05)
        yield f"redis+cluster://127.0.0.1:{ports[0]}"
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float = 15) -> None:
    """SIGTERM a process started in a session of its own, then SIGKILL whatever is left of its
    process group (a Spark worker's executors and their Python workers)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole group is gone
        pass
    proc.wait(timeout=10)


@dataclass(frozen=True)
class SparkStandalone:
    url: str  # spark://127.0.0.1:PORT, what drivers are given as their master
    ui: str  # the master's web UI: /json/ lists its workers and applications

    def state(self) -> dict[str, Any]:
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.ui}/json/", timeout=5) as r:
            return json.load(r)  # type: ignore[no-any-return]

    def apps_named(self, name: str) -> int:
        """How many applications of that name the master has run or runs (drivers that really
        used the cluster, not local mode)."""
        state = self.state()
        return sum(app["name"] == name for app in state["activeapps"] + state["completedapps"])


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    """A Spark standalone master and one worker (2 cores, 1 GiB) on loopback, started with the
    venv's pyspark (`bin/spark-class`) as a cluster runs them, once the worker has registered.
    Executors run this interpreter and import this checkout."""
    import shutil

    import pyspark

    from ndstore.ops.localstack import free_port

    if shutil.which("java") is None:
        pytest.skip("no JRE: Spark needs java")
    home = Path(pyspark.__file__).resolve().parent
    root = tmp_path_factory.mktemp("spark-standalone")
    port, ui = free_port(), free_port()
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "512m",
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false", "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    cluster = SparkStandalone(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}")
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> None:
        with open(root / f"{name}.log", "wb") as log:
            procs.append(subprocess.Popen([str(home / "bin" / "spark-class"), *args], env=env, cwd=root, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))

    def worker_registered() -> bool:
        if any(p.poll() is not None for p in procs):
            logs = "\n".join((root / f"{n}.log").read_text()[-3000:] for n in ("master", "worker"))
            pytest.fail(f"a Spark standalone daemon exited:\n{logs}")
        try:
            return int(cluster.state()["aliveworkers"]) >= 1
        except (OSError, ValueError):  # the master's UI is not up yet (once: an HTML page at /json/)
            return False

    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui))
        start("worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "2",
              "--memory", "1g", "--webui-port", str(free_port()), "--work-dir", str(root / "work"), cluster.url)
        deadline = time.monotonic() + 120
        while not worker_registered():
            assert time.monotonic() < deadline, f"no Spark worker registered in 120 s; logs in {root}"
            time.sleep(0.2)
        yield cluster
    finally:
        for proc in reversed(procs):  # the worker (and its executors) first
            _stop_group(proc)


@pytest.fixture(scope="session")
def spark_master_url(spark_standalone: SparkStandalone) -> str:
    """`spark://127.0.0.1:PORT` of the session's Spark standalone master (one worker registered)."""
    return spark_standalone.url


@pytest.fixture
def ingest_env(service_env: dict[str, str], moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The service wired to moto (S3, DynamoDB, and the ingest pipeline's S3/SQS/DynamoDB) and the
    test Redis, with a base-tier bucket and table, a tile bucket, table and queue prefix of its
    own. Returns the suffix of those names."""
    import uuid

    import redis

    from ndstore import wiring

    redis.Redis.from_url(service_env["NDSTORE_REDIS_URL"]).flushdb()
    suffix = uuid.uuid4().hex[:10]
    for name, value in {"NDSTORE_S3_BUCKET": f"ndstore-test-{suffix}",
                        "NDSTORE_DYNAMODB_TABLE": f"ndstore-test-{suffix}",
                        "NDSTORE_INGEST_ENDPOINT_URL": moto_endpoint, "NDSTORE_TILE_BUCKET": f"tiles-{suffix}",
                        "NDSTORE_TILE_INDEX_TABLE": f"tiles-{suffix}", "NDSTORE_INGEST_QUEUE_PREFIX": f"ing-{suffix}",
                        "NDSTORE_INGEST_VISIBILITY_S": "120", "NDSTORE_INGEST_MAX_TRIES": "3"}.items():
        monkeypatch.setenv(name, value)
    wiring.services.cache_clear()
    yield suffix
    wiring.services.cache_clear()


def moto_lambda_function(endpoint: str, handler: str) -> str:
    """A Lambda function registered with moto's Lambda API (never invoked: no container runs
    here), for tests of the triggers the service creates; returns its ARN."""
    import io
    import uuid
    import zipfile

    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint)
    role = iam.create_role(RoleName=f"fn-{uuid.uuid4().hex[:8]}", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as z:
        z.writestr(handler.rpartition(".")[0].replace(".", "/") + ".py", "def handler(event, context): pass\n")
    lam = boto3.client("lambda", endpoint_url=endpoint)
    return str(lam.create_function(FunctionName=f"ndstore-{uuid.uuid4().hex[:8]}", Runtime="python3.12", Role=role,
                                   Handler=handler, Code={"ZipFile": code.getvalue()})["FunctionArn"])
