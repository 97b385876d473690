"""`ndstore up`: the whole local stack in the foreground, its data under one directory.

Starts a redis-server (AOF on: the locks and the cache tier) and another for the NDBlaze buffer
(AOF on, no eviction), prepares the metadata database, the object store and the index, mints the
admin token, optionally loads the demo dataset, then runs the cache tier's daemons (flusher,
cache manager), the NDBlaze merger (a Spark driver in local mode), the ingest pipeline's runner
(its queues, tile store and job state under the data dir, unless NDSTORE_INGEST_ENDPOINT_URL names
an S3/SQS/DynamoDB endpoint) and
the web service (nginx in front of gunicorn: ndstore.ops.front) until interrupted. Everything binds
to 127.0.0.1 by default.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis

from ndstore.ops.front import Front
from ndstore.ops.processes import StartFailed, on_stop_signal, run_until_stopped, stop_in_reverse, wait_until

ROOT = Path(__file__).resolve().parents[2]
STACK_ENV = "stack-env.json"
# One arena: the trim threshold and top pad apply per arena, and each of a worker's threads takes
# an arena of its own (up to 8 x cores), so freed memory kept would be arenas x 320 MiB, not 320
# (docs/design/serving.md, "gunicorn workers").
MALLOC_TUNING = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_THRESHOLD_": str(64 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(256 << 20),
    "MALLOC_TOP_PAD_": str(64 << 20),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# What Redis holds of ours is blosc-compressed already (cuboids, NDBlaze bodies): LZF-compressing
# each value again when it rewrites its AOF (the RDB preamble) saved nothing and cost ~5x the CPU
# of the rewrite (docs/design/serving.md, "What the cache Redis logs"). Compose passes the same.
RDB_NO_LZF = ("--rdbcompression", "no")


def start_redis(data_dir: Path, port: int, appendfsync: str = "always",
                extra: tuple[str, ...] = (), appendonly: bool = True) -> subprocess.Popen[bytes]:
    """A redis-server on 127.0.0.1:port with AOF persistence (unless appendonly is False) under data_dir."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed; `make run` installs it with apt")
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
         "--appendonly", "yes" if appendonly else "no",
         "--appendfsync", appendfsync, "--save", "", "--daemonize", "no", "--protected-mode", "yes",
         *RDB_NO_LZF,
         "--logfile", str(data_dir / "redis.log"), *extra],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    wait_until(lambda: proc.poll() is None and client.ping(), f"redis-server on port {port}")
    return proc


@dataclass
class LocalStack:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8000
    redis_port: int = 0
    blaze_redis_port: int = 0
    workers: int = 2
    threads: int = 4
    extra_env: Mapping[str, str | None] = field(default_factory=dict)  # None: unset an inherited setting
    with_merger: bool = True  # tests of other parts leave the Spark driver out
    with_runner: bool = True  # and the ingest runner (its worker processes), where nothing is ingested
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    front: Front | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.extra_env.get("NDSTORE_FRONT_TLS_CERTIFICATE") else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def log_dir(self) -> Path:
        """Where the logs of processes too chatty for the console go (the merger's JVM)."""
        path = self.data_dir / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def secret_key(self) -> str:
        """NDSTORE_SECRET_KEY when set, else one made for this data directory at its first start
        (kept in `secret_key`, 0600): it signs what the ingest handlers trust."""
        if os.environ.get("NDSTORE_SECRET_KEY"):
            return os.environ["NDSTORE_SECRET_KEY"]
        path = self.data_dir / "secret_key"
        if not path.exists():
            path.touch(mode=0o600)
            path.write_text(secrets.token_hex(32))
        return path.read_text().strip()

    def environment(self) -> dict[str, str]:
        env = {
            **os.environ,
            **MALLOC_TUNING,
            "NDSTORE_SECRET_KEY": self.secret_key(),
            "NDSTORE_DATA_DIR": str(self.data_dir),
            "NDSTORE_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "NDSTORE_BLAZE_REDIS_URL": f"redis://127.0.0.1:{self.blaze_redis_port}/0",
            "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "ndstore.api.settings.base"),
        }
        for name, value in self.extra_env.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        if "NDSTORE_INGEST_ENDPOINT_URL" not in env:  # the local tile store: uploads come to this service
            env.setdefault("NDSTORE_INGEST_PUBLIC_ENDPOINT_URL", self.url)
        return env

    def start(self) -> None:
        """Start every service and wait until they serve; on any failure or interrupt, stop what
        was started before raising."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.redis_port = self.redis_port or free_port()
        self.blaze_redis_port = self.blaze_redis_port or free_port()
        fsync = os.environ.get("NDSTORE_REDIS_APPENDFSYNC", "always")
        self.procs.append(start_redis(self.data_dir / "redis", self.redis_port, appendfsync=fsync))
        env = self.environment()
        self._write_stack_env(env)
        self.procs.append(start_redis(self.data_dir / "blaze-redis", self.blaze_redis_port, appendfsync=fsync,
                                      extra=self._blaze_redis_limits(env),
                                      appendonly=env.get("NDSTORE_BLAZE_REDIS_APPENDONLY", "yes") == "yes"))
        subprocess.run([sys.executable, "-m", "django", "ndstore_prepare"], env=env, check=True, cwd=ROOT)
        cli = [sys.executable, "-m", "ndstore.cli"]
        self.procs.append(subprocess.Popen([*cli, "daemons"], env=env, cwd=ROOT))
        if self.with_merger:  # its JVM's start-up chatter goes to a file, unless -v
            quiet = env.get("NDSTORE_LIBRARY_LOG_LEVEL", "WARNING").upper() not in ("INFO", "DEBUG")
            out = open(self.log_dir / "merger.log", "ab") if quiet else None  # noqa: SIM115 - kept by the child
            self.procs.append(subprocess.Popen([*cli, "blaze", "merger"], env=env, cwd=ROOT, stdout=out,
                                               stderr=subprocess.STDOUT if out else None))
            if out:
                out.close()
        if self.with_runner:
            self.procs.append(subprocess.Popen([sys.executable, "-m", "lambdas.runner"], env=env, cwd=ROOT))
        self.front = Front(self.data_dir / "front", self.host, self.port, env)
        self.procs.append(self.front.start_gunicorn(env, self.workers, self.threads))
        wait_until(self._web_ready, "the web service (gunicorn)", timeout=60)
        self.procs.append(self.front.start_nginx())
        wait_until(self._front_ready, f"the web service's front (nginx) at {self.url}", timeout=30)
        # The merger's JVM takes seconds of both cores to boot; a caller that starts measuring or
        # writing before it is up would share the machine with that boot.
        if self.with_merger:
            wait_until(self._merger_ready, "the NDBlaze merger (Spark driver)", timeout=180)

    def _write_stack_env(self, env: dict[str, str]) -> None:
        """The stack's NDSTORE_* settings (its Redis ports, the ingest endpoint), for CLI verbs
        that work on the running stack's data in a process of their own (`--data-dir`)."""
        path = self.data_dir / STACK_ENV
        path.write_text(json.dumps({k: v for k, v in env.items() if k.startswith("NDSTORE_")}, indent=1))
        path.chmod(0o600)

    @staticmethod
    def _blaze_redis_limits(env: dict[str, str]) -> tuple[str, ...]:
        """A hard memory cap past the buffer's own limit, with no eviction: a write past it is
        refused (503), never silently dropped."""
        pending = int(env.get("NDSTORE_BLAZE_MAX_PENDING_BYTES", str(4 << 30)))
        return ("--maxmemory", str(pending + (1 << 30)), "--maxmemory-policy", "noeviction")

    def _web_ready(self) -> bool:
        if any(p.poll() is not None for p in self.procs):
            raise StartFailed("a service of the local stack exited during start-up")
        assert self.front is not None
        return self.front.gunicorn_ready()

    def _front_ready(self) -> bool:
        if any(p.poll() is not None for p in self.procs):
            raise StartFailed("a service of the local stack exited during start-up (the front's log: "
                               f"{self.data_dir / 'front' / 'error.log'})")
        with socket.create_connection((self.host, self.port), timeout=1):
            return True

    def _merger_ready(self) -> bool:
        if any(p.poll() is not None for p in self.procs):
            raise StartFailed("a service of the local stack exited during start-up")
        from ndstore.wiring import merger_announced  # the services' modules, only where a merger is awaited

        return merger_announced(f"redis://127.0.0.1:{self.blaze_redis_port}/0")

    def wait(self) -> int:
        """Block until a signal arrives or a service dies; then stop everything."""
        signalled = run_until_stopped(self.procs, on_stop_signal())
        self.stop()
        return 0 if signalled else 1

    def __enter__(self) -> LocalStack:
        self.start()  # stops what it started if it fails
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop in reverse order of start, each fully before the next: nginx and gunicorn first (no
        new writes), then the ingest runner and the merger (each finishes its batch or round), the
        daemons (which write back everything dirty), then the Redis servers."""
        stop_in_reverse(self.procs, timeout_s=120)
        self.procs.clear()
