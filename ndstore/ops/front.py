"""The event-loop front of a web node: nginx before gunicorn, so a slow or stalled client costs a
socket in nginx, never a gunicorn thread.

nginx reads each request's line, headers and body in full (with timeouts) before it hands the
request to gunicorn over a Unix socket, and takes gunicorn's response as fast as gunicorn writes it
(memory, then a temp file), feeding the client at the client's pace. `ndstore up` and the image's
default command (`ndstore serve`) both run it; docker-compose's outer nginx routes between nodes
and streams, this one buffers. See docs/design/serving.md.

What one client may cost it (docs/reliability.md, "Bounds"): where it faces clients, its stream
server counts connections per address as it accepts them and hands each to the http server with
the PROXY protocol; a body of 100,000 bytes or more is read only once the service admitted it
(nginx's auth_request to ndstore/api/admission.py, with the headers alone); per-client limits
name a client by the X-Forwarded-For hop the trusted proxies vouch for; its own errors are JSON.
"""

from __future__ import annotations

import json
import os
import re
import resource
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
ADMIT_PATH = "/_ndstore/admit"  # = ndstore.api.admission.ADMIT_PATH (the front runs no Django)
WEB_NOT_ANSWERING = {"status": "failing", "parts": {"web": "failing"},
                     "message": "not answering: web (the web workers did not answer /healthz within 2 s)"}
ADMISSION_BYTES = 100_000  # declared bodies this large or larger are read only once admitted (a power of ten)
ERROR_PREFIX = "/_ndstore/error/"
FD_RESERVE = 256  # descriptors nginx keeps for its logs and temp files, beyond its connections
# nginx's own errors, answered as JSON like every error of the service (code: what it means here)
ERRORS = {
    400: "bad request: the front could not parse it (a malformed request line or header)",
    408: "the request did not arrive in time (NDSTORE_FRONT_HEADER_TIMEOUT_S / _BODY_TIMEOUT_S)",
    413: "request body too large (NDSTORE_MAX_BODY_BYTES)",
    414: "request line too long (at most 16 KiB)",
    494: "request header too large (at most 16 KiB a line, 64 KiB in all)",
    500: "internal error in the front",
    502: "the web workers are not answering",
    503: "too many requests in progress from this client (NDSTORE_FRONT_CONNECTIONS_PER_CLIENT); retry shortly",
    504: "the web workers did not answer in time (NDSTORE_WEB_TIMEOUT)",
}


def _env_int(env: dict[str, str], name: str, default: int) -> int:
    value = env.get(name, "")
    return int(value) if value else default


@dataclass(frozen=True)
class FrontSettings:
    """Timeouts and limits of the front (NDSTORE_FRONT_*; docs/deployment.md)."""

    header_timeout_s: int = 10  # the request line and headers must arrive within this
    body_timeout_s: int = 30  # longest pause between two reads of a request body
    send_timeout_s: int = 60  # longest pause of a client reading its response
    keepalive_s: int = 15  # an idle kept-alive connection is closed after this
    conns_per_client: int = 128  # requests in progress per client address (503 beyond)
    bodies_per_client: int = 16  # request bodies of 100,000 bytes or more being received per client
    conns_per_address: int = 256  # TCP connections per address, counted when accepted (0: no limit)
    max_body_bytes: int = 1 << 30  # = NDSTORE_MAX_BODY_BYTES
    upstream_timeout_s: int = 300  # = NDSTORE_WEB_TIMEOUT
    trusted_proxies: int = 0  # proxies in front of this one (NDSTORE_NUM_PROXIES)
    tls_certificate: str = ""  # PEM files: with both, the front speaks https (NDSTORE_FRONT_TLS_*)
    tls_key: str = ""

    @classmethod
    def from_environment(cls, env: dict[str, str] | None = None) -> FrontSettings:
        env = dict(os.environ if env is None else env)
        return cls(header_timeout_s=_env_int(env, "NDSTORE_FRONT_HEADER_TIMEOUT_S", 10),
                   body_timeout_s=_env_int(env, "NDSTORE_FRONT_BODY_TIMEOUT_S", 30),
                   send_timeout_s=_env_int(env, "NDSTORE_FRONT_SEND_TIMEOUT_S", 60),
                   keepalive_s=_env_int(env, "NDSTORE_FRONT_KEEPALIVE_S", 15),
                   conns_per_client=_env_int(env, "NDSTORE_FRONT_CONNECTIONS_PER_CLIENT", 128),
                   bodies_per_client=_env_int(env, "NDSTORE_FRONT_BODIES_PER_CLIENT", 16),
                   conns_per_address=_env_int(env, "NDSTORE_FRONT_CONNECTIONS_PER_ADDRESS", 256),
                   max_body_bytes=_env_int(env, "NDSTORE_MAX_BODY_BYTES", 1 << 30),
                   upstream_timeout_s=_env_int(env, "NDSTORE_WEB_TIMEOUT", 300),
                   trusted_proxies=_env_int(env, "NDSTORE_NUM_PROXIES", 0),
                   tls_certificate=env.get("NDSTORE_FRONT_TLS_CERTIFICATE", ""),
                   tls_key=env.get("NDSTORE_FRONT_TLS_KEY", ""))

    @property
    def tls(self) -> bool:
        """Whether the front speaks https: Neuroglancer's middleauth+ and boss:// sources work only
        over https (docs/deployment.md)."""
        if bool(self.tls_certificate) != bool(self.tls_key):
            raise ValueError("NDSTORE_FRONT_TLS_CERTIFICATE and NDSTORE_FRONT_TLS_KEY go together: set both or neither")
        return bool(self.tls_certificate)

    @property
    def gates_addresses(self) -> bool:
        """Whether the front counts connections per address as it accepts them: only where its
        TCP peers are the clients themselves (behind proxies the peer is a proxy)."""
        return self.conns_per_address > 0 and self.trusted_proxies == 0


def descriptor_budget() -> tuple[int, int]:
    """(the descriptors nginx's worker may open, its worker_connections): as many as this process
    may raise its own limit to, less FD_RESERVE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nofile = min(hard if hard != resource.RLIM_INFINITY else 1 << 20, 1 << 20)
    return nofile, max(512, nofile - FD_RESERVE)


def stream_module(nginx: str) -> str | None:
    """The `load_module` line the stream module needs: none when nginx has it built in. Raises
    when it has neither (Debian: apt-get install libnginx-mod-stream)."""
    built = subprocess.run([nginx, "-V"], capture_output=True, text=True).stderr
    if re.search(r"--with-stream(\s|$)", built):
        return None
    modules = re.search(r"--modules-path=(\S+)", built)
    path = Path(modules.group(1) if modules else "/usr/lib/nginx/modules") / "ngx_stream_module.so"
    if "--with-stream=dynamic" in built and path.exists():
        return f"load_module {path};"
    raise RuntimeError("nginx has no stream module, which the front needs to count connections per address as it "
                       "accepts them (apt-get install libnginx-mod-stream, or `make run`, which installs it; or set "
                       "NDSTORE_FRONT_CONNECTIONS_PER_ADDRESS=0)")


def client_key(settings: FrontSettings) -> tuple[str, str]:
    """The nginx variable that names a client for the per-client limits, and the map that makes
    it: behind trusted proxies the X-Forwarded-For hop they vouch for (as the service's rate
    limits and audit log read it: the n-th from the right, or the leftmost of fewer), else the
    peer (the client's own address, after the PROXY protocol of the address gate)."""
    if settings.trusted_proxies == 0:
        return "$binary_remote_addr", ""
    later = r"\s*,\s*[^,\s]+" * (settings.trusted_proxies - 1)
    return "$ndstore_client", rf"""map $http_x_forwarded_for $ndstore_client {{
        "~(?<hop>[^,\s]+){later}\s*$" $hop;
        "~^\s*(?<first>[^,\s]+)" $first;
        default $remote_addr;
    }}"""


def _error_pages(extra: str = "") -> str:
    """nginx's own errors to the JSON pages below (a URI, not a named location: a request whose
    line could not be parsed cannot be redirected to a named one)."""
    pages = " ".join(f"error_page {code} {ERROR_PREFIX}{code};" for code in ERRORS)
    return f"{pages} {extra}".strip()


def _error_locations() -> str:
    blocks = []
    for code, message in ERRORS.items():
        status = 400 if code == 494 else code
        body = json.dumps({"status": status, "message": message}).replace("'", "\\'")
        blocks.append(f"        location = {ERROR_PREFIX}{code} {{ internal; default_type application/json; "
                      f"return {status} '{body}'; }}")
    return "\n".join(blocks)


def _refusals() -> str:
    """The admission's refusals, with the status it chose (auth_request passes on 401 and 403 only)."""
    lines = [f"            if ($ndstore_status = {code}) {{ return {code} $ndstore_refusal; }}"
             for code in (400, 404, 411, 413, 429, 503)]
    return "\n".join(lines)


def nginx_config(listen: str, upstream: str, state_dir: Path, settings: FrontSettings,
                 stream_load: str | None = None, inner: Path | None = None) -> str:
    """nginx.conf of a front listening on `listen` (host:port) before gunicorn at `upstream`
    (`unix:/path` or host:port), keeping its pid, temp files and error log in `state_dir`.
    ``stream_load``: the `load_module` line of the stream module, where it is not built in;
    ``inner``: where the http server listens behind the address gate (state_dir/front.sock)."""
    user = "user root root;" if os.geteuid() == 0 else ""  # workers as the user who started it
    proto = "$scheme" if settings.trusted_proxies == 0 else "$http_x_forwarded_proto"
    temp = "\n".join(f"    {kind}_temp_path {state_dir / kind};"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    nofile, connections = descriptor_budget()
    inner = inner or state_dir / "front.sock"
    gate = _address_gate(listen, inner, settings) if settings.gates_addresses else ""
    ssl = " ssl" if settings.tls else ""
    http_listen = (f"listen unix:{inner}{ssl} proxy_protocol;\n        set_real_ip_from unix:;\n"
                   f"        real_ip_header proxy_protocol;" if settings.gates_addresses
                   else f"listen {listen}{ssl} backlog=4096;")
    if settings.tls:
        http_listen += (f"\n        ssl_certificate {settings.tls_certificate};\n"
                        f"        ssl_certificate_key {settings.tls_key};\n"
                        "        ssl_protocols TLSv1.2 TLSv1.3;")
    proxy = _proxy_settings(proto, settings)
    key, key_map = client_key(settings)
    small_digits = len(str(ADMISSION_BYTES)) - 1  # lengths of at most this many digits are below it
    return f"""# Written by ndstore.ops.front at each start; edits are lost.
{(stream_load or "") if settings.gates_addresses else ""}
daemon off;
{user}
worker_processes 1;
worker_rlimit_nofile {nofile};
pid {state_dir / 'nginx.pid'};
error_log {state_dir / 'error.log'} warn;

events {{
    worker_connections {connections};     # the descriptors it may open, less what it keeps for files
}}
{gate}
http {{
    access_log off;                      # the service logs one line per request itself
    sendfile on;                         # a buffered body goes from its temp file to gunicorn in the kernel
{temp}
    client_header_timeout {settings.header_timeout_s}s;
    client_body_timeout {settings.body_timeout_s}s;
    send_timeout {settings.send_timeout_s}s;
    keepalive_timeout {settings.keepalive_s}s;
    reset_timedout_connection on;
    client_max_body_size {settings.max_body_bytes};
    client_body_buffer_size 1m;          # bodies beyond it wait in a temp file, not in a worker
    large_client_header_buffers 4 16k;
    {key_map}
    limit_conn_zone {key} zone=per_client:4m;
    limit_conn_zone {key} zone=bodies_per_client:4m;
    limit_conn_status 503;
    map $http_content_length $ndstore_small_body {{ "" 1; "~^[0-9]{{1,{small_digits}}}$" 1; default 0; }}
    map $http_transfer_encoding $ndstore_chunked {{ "" 0; default 1; }}
    # a body of ADMISSION_BYTES or more, or of unknown length, is read only once admitted
    map "$ndstore_small_body$ndstore_chunked" $ndstore_admission {{ "10" 0; default 1; }}

    upstream gunicorn {{
        server {upstream};
        keepalive 16;
    }}

    server {{
        {http_listen}
        limit_conn per_client {settings.conns_per_client};
        {_error_pages()}

        location / {{
            if ($ndstore_admission) {{ rewrite ^ /_ndstore/admitted-body last; }}
            proxy_pass http://gunicorn;
{proxy}
        }}

        # Bodies that must be admitted first: nginx asks the service (ndstore/api/admission.py)
        # with the request's headers only, before it reads a byte of the body.
        location = /_ndstore/admitted-body {{
            internal;
            auth_request {ADMIT_PATH};
            auth_request_set $ndstore_status $upstream_http_x_ndstore_status;
            auth_request_set $ndstore_refusal $upstream_http_x_ndstore_refusal;
            {_error_pages("error_page 401 = @refused_401; error_page 403 = @refused;")}
            limit_conn per_client {settings.conns_per_client};   # a location's limits replace the server's
            limit_conn bodies_per_client {settings.bodies_per_client};
            proxy_pass http://gunicorn$request_uri;
{proxy}
        }}

        location = {ADMIT_PATH} {{
            internal;
            proxy_pass http://gunicorn;
            proxy_pass_request_body off;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Content-Length "";
            proxy_set_header Transfer-Encoding "";
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto {proto};
            proxy_set_header X-Ndstore-Method $request_method;
            proxy_set_header X-Ndstore-Uri $request_uri;
            proxy_set_header X-Ndstore-Length $http_content_length;
            proxy_set_header X-Ndstore-Chunked $ndstore_chunked;
            proxy_connect_timeout 10s;
            proxy_read_timeout 30s;
        }}

        location @refused {{
            default_type application/json;
{_refusals()}
            return 403 $ndstore_refusal;
        }}

        location @refused_401 {{
            default_type application/json;
            add_header WWW-Authenticate Token always;
            return 401 $ndstore_refusal;
        }}

        # A load balancer's probe is answered within ~2 s even when every web thread is busy.
        location = /healthz {{
            proxy_pass http://gunicorn;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_connect_timeout 1s;
            proxy_read_timeout 2s;
            error_page 502 504 = @web_not_answering;
        }}

        location @web_not_answering {{
            default_type application/json;
            return 503 '{json.dumps(WEB_NOT_ANSWERING)}';
        }}

{_error_locations()}
    }}
}}
"""


def _address_gate(listen: str, inner: Path, settings: FrontSettings) -> str:
    """The stream server that accepts the clients' TCP connections, at most conns_per_address per
    address (closed at once beyond), and hands each to the http server with its address (PROXY
    protocol). Its idle timeout outlasts every timeout of the http server behind it."""
    idle = max(settings.upstream_timeout_s, settings.send_timeout_s, settings.body_timeout_s) + 30
    return f"""
stream {{
    limit_conn_zone $binary_remote_addr zone=per_address:4m;
    server {{
        listen {listen} backlog=4096;
        limit_conn per_address {settings.conns_per_address};
        proxy_pass unix:{inner};
        proxy_protocol on;
        proxy_buffer_size 256k;
        proxy_timeout {idle}s;
    }}
}}
"""


def _proxy_settings(proto: str, settings: FrontSettings) -> str:
    return f"""            proxy_http_version 1.1;
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
            proxy_send_timeout {settings.upstream_timeout_s}s;"""


def nginx_executable() -> str:
    exe = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                         if os.access(p, os.X_OK)), None)
    if exe is None:
        raise RuntimeError("nginx is not installed: it is the web service's front (apt-get install nginx-light, "
                           "or `make run`, which installs it)")
    return exe


def upstream_socket(state_dir: Path, name: str = "web.sock") -> Path:
    """Where gunicorn (web.sock) or the front's http server behind its address gate (front.sock)
    listens: in the state dir, or a fresh private dir when that path is too long for a Unix
    socket. A socket file left by a process that was killed is removed (binding would fail)."""
    path = state_dir / name
    if len(str(path)) > MAX_UNIX_PATH:
        path = Path(tempfile.mkdtemp(prefix="ndstore-front-")) / name
    path.unlink(missing_ok=True)
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
        self.inner = upstream_socket(state_dir, "front.sock")

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
        load = stream_module(self.nginx) if self.settings.gates_addresses else None
        conf.write_text(nginx_config(self.listen, f"unix:{self.socket}", self.state_dir, self.settings, load,
                                     self.inner))
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
