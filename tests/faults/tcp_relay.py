"""A TCP relay on 127.0.0.1 that can stall: it forwards bytes both ways between its clients and
one upstream (a PostgreSQL server here) until `stall()`, then forwards nothing, holding every
connection open, until `resume()`. To a client that is what a paused server looks like: its
connection is accepted and its bytes leave, and no answer comes. The upstream itself is never
paused, so a shared server (the machine's PostgreSQL) can stand behind it.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class StallingRelay:
    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._flowing = threading.Event()
        self._flowing.set()
        self._stopped = threading.Event()
        self._sockets: list[socket.socket] = []
        self._guard = threading.Lock()

    def start(self) -> StallingRelay:
        threading.Thread(target=self._accept, daemon=True, name="relay-accept").start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._flowing.set()
        self._listener.close()
        with self._guard:
            for s in self._sockets:
                s.close()

    @contextmanager
    def stalled(self) -> Iterator[None]:
        self._flowing.clear()
        try:
            yield
        finally:
            self._flowing.set()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._guard:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True, name="relay-pump").start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peer = {a: b, b: a}
        try:
            while not self._stopped.is_set():
                self._flowing.wait()
                ready, _, _ = select.select([a, b], [], [], 0.1)
                for s in ready:
                    if not self._flowing.is_set():
                        break  # stalled between the wait and the select: this data waits
                    data = s.recv(65536)
                    if not data:
                        return
                    peer[s].sendall(data)
        except OSError:
            return
        finally:
            a.close()
            b.close()
