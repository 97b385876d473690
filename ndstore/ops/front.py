"""The event-loop front of a web node: nginx before gunicorn, so a slow or stalled client costs a
socket in nginx, never a gunicorn thread.

nginx reads each request's line, headers and body in full (with timeouts) before it hands the
request to gunicorn over a Unix socket, and takes gunicorn's response as fast as gunicorn writes it
(memory, then a temp file), feeding the client at the client's pace. `ndstore up` and the image's
default command (`ndstore serve`) both run it; docker-compose's outer nginx routes between nodes
and streams, this one buffers. See docs/design/serving.md.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ndstore.ops.processes import on_stop_signal, run_until_stopped, stop_in_reverse, wait_until

ROOT = Path(__file__).resolve().parents[2]
MAX_UNIX_PATH = 100  # sun_path holds 108 bytes


def _env_int(env: dict[str, str], name: str, default: int) -> int:
    value = env.get(name, "")
    return int(value) if value else default


@dataclass(frozen=True)
class FrontSettings:
    """Timeouts and limits of the front (NDSTORE_FRONT_*; docs/deployment.md)."""

    header_timeout_s: int = 10  # the request line and headers must arrive within this
    body_timeout_s: int = 30  # longest pause between two reads of a request body
    send_timeout_s: int = 60  # longest pause of a client reading its response
    conns_per_client: int = 128  # requests in progress per client address (503 beyond)
    max_body_bytes: int = 1 << 30  # = NDSTORE_MAX_BODY_BYTES
    upstream_timeout_s: int = 300  # = NDSTORE_WEB_TIMEOUT
    trusted_proxies: int = 0  # proxies in front of this one (NDSTORE_NUM_PROXIES)

    @classmethod
    def from_environment(cls, env: dict[str, str] | None = None) -> FrontSettings:
        env = dict(os.environ if env is None else env)
        return cls(header_timeout_s=_env_int(env, "NDSTORE_FRONT_HEADER_TIMEOUT_S", 10),
                   body_timeout_s=_env_int(env, "NDSTORE_FRONT_BODY_TIMEOUT_S", 30),
                   send_timeout_s=_env_int(env, "NDSTORE_FRONT_SEND_TIMEOUT_S", 60),
                   conns_per_client=_env_int(env, "NDSTORE_FRONT_CONNECTIONS_PER_CLIENT", 128),
                   max_body_bytes=_env_int(env, "NDSTORE_MAX_BODY_BYTES", 1 << 30),
                   upstream_timeout_s=_env_int(env, "NDSTORE_WEB_TIMEOUT", 300),
                   trusted_proxies=_env_int(env, "NDSTORE_NUM_PROXIES", 0))


def nginx_config(listen: str, upstream: str, state_dir: Path, settings: FrontSettings) -> str:
    """nginx.conf of a front listening on `listen` (host:port) before gunicorn at `upstream`
    (`unix:/path` or host:port), keeping its pid, temp files and error log in `state_dir`."""
    user = "user root root;" if os.geteuid() == 0 else ""  # workers as the user who started it
    proto = "$scheme" if settings.trusted_proxies == 0 else "$http_x_forwarded_proto"
    temp = "\n".join(f"    {kind}_temp_path {state_dir / kind};"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""# Written by ndstore.ops.front at each start; edits are lost.
daemon off;
{user}
worker_processes 1;
pid {state_dir / 'nginx.pid'};
error_log {state_dir / 'error.log'} warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;                      # the service logs one line per request itself
    sendfile on;                         # a buffered body goes from its temp file to gunicorn in the kernel
{temp}
    client_header_timeout {settings.header_timeout_s}s;
    client_body_timeout {settings.body_timeout_s}s;
    send_timeout {settings.send_timeout_s}s;
    keepalive_timeout 30s;
    reset_timedout_connection on;
    client_max_body_size {settings.max_body_bytes};
    client_body_buffer_size 1m;          # bodies beyond it wait in a temp file, not in a worker
    large_client_header_buffers 4 16k;
    limit_conn_zone $binary_remote_addr zone=per_client:4m;
    limit_conn per_client {settings.conns_per_client};
    limit_conn_status 503;

    upstream gunicorn {{
        server {upstream};
        keepalive 16;
    }}

    server {{
        listen {listen} backlog=4096;
        location / {{
            proxy_pass http://gunicorn;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto {proto};
            proxy_request_buffering on;      # gunicorn sees a request only once it is whole
            proxy_buffering on;              # and hands its response over at its own pace
            proxy_buffers 64 64k;
            proxy_busy_buffers_size 256k;
            proxy_max_temp_file_size 1024m;     # = NDSTORE_MAX_CUTOUT_BYTES; beyond it gunicorn waits
            proxy_connect_timeout 10s;
            proxy_read_timeout {settings.upstream_timeout_s}s;
            proxy_send_timeout {settings.upstream_timeout_s}s;
        }}
    }}
}}
"""


def nginx_executable() -> str:
    exe = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                         if os.access(p, os.X_OK)), None)
    if exe is None:
        raise RuntimeError("nginx is not installed: it is the web service's front (apt-get install nginx-light, "
                           "or `make run`, which installs it)")
    return exe


def upstream_socket(state_dir: Path) -> Path:
    """Where gunicorn listens: in the state dir, or a fresh private dir when that path is too long
    for a Unix socket."""
    path = state_dir / "web.sock"
    if len(str(path)) > MAX_UNIX_PATH:
        path = Path(tempfile.mkdtemp(prefix="ndstore-web-")) / "web.sock"
    return path


class Front:
    """nginx on `host:port` before gunicorn on a private Unix socket."""

    def __init__(self, state_dir: Path, host: str, port: int, env: dict[str, str]):
        self.state_dir = state_dir
        self.listen = f"{host}:{port}"
        self.settings = FrontSettings.from_environment(env)
        self.nginx = nginx_executable()  # refuse at once, before anything is started
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.socket = upstream_socket(state_dir)
        self.socket.unlink(missing_ok=True)

    def gunicorn_environment(self, env: dict[str, str]) -> dict[str, str]:
        """gunicorn's settings: one more trusted X-Forwarded-For hop (this front's)."""
        return {**env, "NDSTORE_NUM_PROXIES": str(self.settings.trusted_proxies + 1)}

    def start_gunicorn(self, env: dict[str, str], workers: int | None, threads: int | None) -> subprocess.Popen[bytes]:
        """gunicorn on the socket; workers and threads as given, else deploy/gunicorn.conf.py's."""
        cmd = [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "deploy" / "gunicorn.conf.py"),
               "--bind", f"unix:{self.socket}"]
        cmd += ["--workers", str(workers)] if workers else []
        cmd += ["--threads", str(threads)] if threads else []
        return subprocess.Popen(cmd, env=self.gunicorn_environment(env), cwd=ROOT)

    def start_nginx(self) -> subprocess.Popen[bytes]:
        conf = self.state_dir / "nginx.conf"
        conf.write_text(nginx_config(self.listen, f"unix:{self.socket}", self.state_dir, self.settings))
        exe = self.nginx
        # -e: its own error log from the first line on (not the packaged /var/log/nginx)
        args = ["-c", str(conf), "-p", str(self.state_dir), "-e", str(self.state_dir / "error.log")]
        check = subprocess.run([exe, "-t", "-q", *args], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"the front's nginx configuration is refused: {check.stderr.strip()}")
        return subprocess.Popen([exe, *args])

    def gunicorn_ready(self) -> bool:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(1)
            s.connect(str(self.socket))
            return True


def serve(host: str, port: int, workers: int | None, threads: int | None, state_dir: Path) -> int:
    """Run one web node (the image's command): the front on host:port, gunicorn behind it, until
    SIGINT/SIGTERM or until either exits; then stop both (nginx first: no new requests)."""
    env = dict(os.environ)
    front = Front(state_dir, host, port, env)
    stopped = on_stop_signal()
    procs = [front.start_gunicorn(env, workers, threads)]
    try:
        def settled() -> bool:  # listening, exited, or told to stop
            return stopped() or procs[0].poll() is not None or front.gunicorn_ready()

        wait_until(settled, "gunicorn", timeout=120)
        if not stopped() and procs[0].poll() is None:
            procs.append(front.start_nginx())
        signalled = run_until_stopped(procs, stopped)
    finally:
        stop_in_reverse(procs, timeout_s=60)
    return 0 if signalled else 1
