"""Work queues in one SQLite file: the durable single-machine stand-in for SQS (`SqsQueues`).

It owns the file's tables: `queues` (each queue's visibility timeout and its redrive target,
`<name>-dlq`, with the receive count that sends a message there), `messages` (body, receive
count, the receipt of its latest delivery, and when it is visible), `sizes` (each queue's count
of messages, kept with every change) and `purging` (deleted queues whose messages are still being
removed). Many processes share the file (web workers, the queue runner's workers): WAL mode, a
busy timeout, one short-lived connection per call, and every read-modify-write in a `BEGIN
IMMEDIATE` transaction, so no two receivers are ever handed the same visible message. Semantics
are SQS's (at least once, visibility timeouts, receive counts, dead-letter queues); every sqlite3
failure is a StorageError naming the call.

No call's work grows with a queue's length: a receive reads the messages it hands out (and
those it moves to the dead-letter queue) through the (queue, visible_at) index, visible ones
longest visible first; counts read the kept size and count the messages in flight up to
COUNT_CAP; deleting a queue drops its name at once and its messages PURGE_BATCH at a time, with
the calls that follow (as SQS purges a deleted queue's messages in the background).
"""

from __future__ import annotations

import re
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ndstore.core.errors import StorageError
from ndstore.storage.interfaces import Message, QueueCounts

SCHEME = "sqlite-queue://"
_ARN = "arn:ndstore:sqlite-queue:"
_BATCH = 10  # SQS's most messages per receive
_BUSY_S = 30.0
_POLL_S = 0.05
_DLQ_VISIBILITY_S = 30  # SQS's default: what `SqsQueues.create` gives its dead-letter queues
_MAX_SECONDS = 43200  # SQS's longest visibility timeout (12 h)
_MAX_BODY = 1 << 20  # SQS's largest message, in UTF-8 bytes
_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")  # SQS's queue names (standard queues)
COUNT_CAP = 10_000  # messages in flight counted at most (SQS's counts are approximate too)
PURGE_BATCH = 1000  # a deleted queue's messages removed per call

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS queues (
        name TEXT PRIMARY KEY, visibility_s INTEGER NOT NULL,
        dlq TEXT, max_receives INTEGER) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL, body TEXT NOT NULL,
        receipt TEXT, receive_count INTEGER NOT NULL, visible_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS messages_order ON messages (queue, id)",
    "CREATE INDEX IF NOT EXISTS messages_visible ON messages (queue, visible_at)",
    "CREATE UNIQUE INDEX IF NOT EXISTS messages_receipt ON messages (receipt)",
    "CREATE TABLE IF NOT EXISTS sizes (name TEXT PRIMARY KEY, messages INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS purging (name TEXT PRIMARY KEY) WITHOUT ROWID",
    # a file from before `sizes` was kept: count each queue once
    "INSERT INTO sizes SELECT q.name, (SELECT COUNT(*) FROM messages m WHERE m.queue = q.name) FROM queues q "
    "WHERE q.name NOT IN (SELECT name FROM sizes)",
)
_GROW = "UPDATE sizes SET messages = messages + ? WHERE name = ?"


@dataclass(frozen=True)
class _Queue:
    name: str
    visibility_s: int
    dlq: str | None  # the redrive target; None for a dead-letter queue
    max_receives: int | None


class SqliteQueues:
    """The WorkQueue port over one SQLite file; queues are named by `sqlite-queue://<name>`."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self._clock = clock
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"SQLite queues: cannot create {self.path.parent}: {exc}") from exc
        with self._connection("open") as conn:
            conn.execute("PRAGMA journal_mode=WAL")
        with self._transaction("open") as conn:
            for statement in _SCHEMA:
                conn.execute(statement)

    # -- connections and transactions ---------------------------------------------------------

    @contextmanager
    def _connection(self, call: str) -> Iterator[sqlite3.Connection]:
        """A connection of its own for one call (autocommit: transactions are explicit)."""
        try:
            conn = sqlite3.connect(self.path, timeout=_BUSY_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite queues {call} failed: {exc}") from exc
        try:
            conn.execute("PRAGMA synchronous=FULL")
            yield conn
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite queues {call} failed: {exc}") from exc
        finally:
            conn.close()

    @contextmanager
    def _transaction(self, call: str, immediate: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction, committed when the block ends, rolled back when it raises. IMMEDIATE
        takes the write lock first, so what the block reads no other writer changes meanwhile."""
        with self._connection(call) as conn:
            conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    # -- names, URLs and queues ---------------------------------------------------------------

    @staticmethod
    def _name(url: str) -> str:
        if not url.startswith(SCHEME) or not _NAME.fullmatch(url[len(SCHEME):]):
            raise StorageError(f"not a SQLite queue URL: {url!r}")
        return url[len(SCHEME):]

    @staticmethod
    def _queue(conn: sqlite3.Connection, name: str, call: str) -> _Queue:
        row = conn.execute("SELECT q.visibility_s, d.name, q.max_receives FROM queues q "
                           "LEFT JOIN queues d ON d.name = q.dlq WHERE q.name = ?", (name,)).fetchone()
        if row is None:
            raise StorageError(f"SQLite queues {call}: queue {SCHEME}{name} does not exist")
        return _Queue(name, row[0], row[1], row[2])

    def create(self, name: str, visibility_s: int, max_receives: int) -> str:
        """Create (or find) queue `name` and its dead-letter queue `name-dlq`; returns its URL.
        As on SQS, finding the queue with another visibility or max_receives is an error."""
        dlq = f"{name}-dlq"
        if not _NAME.fullmatch(dlq) or not 0 <= visibility_s <= _MAX_SECONDS or not 1 <= max_receives <= 1000:
            raise StorageError(f"SQLite queues create: bad queue {name!r}, visibility {visibility_s} s "
                               f"or max_receives {max_receives}")
        with self._transaction("create") as conn:
            for queue in (name, dlq):  # a name deleted before starts empty: what is left of it goes now
                if conn.execute("DELETE FROM purging WHERE name = ?", (queue,)).rowcount:
                    conn.execute("DELETE FROM messages WHERE queue = ?", (queue,))
            conn.execute("INSERT OR IGNORE INTO queues VALUES (?, ?, NULL, NULL)", (dlq, _DLQ_VISIBILITY_S))
            wanted = (visibility_s, dlq, max_receives)
            row = conn.execute("SELECT visibility_s, dlq, max_receives FROM queues WHERE name = ?", (name,)).fetchone()
            if row is None:
                conn.execute("INSERT INTO queues VALUES (?, ?, ?, ?)", (name, *wanted))
            elif tuple(row) != wanted:
                raise StorageError(f"SQLite queues create: queue {name} exists with other attributes "
                                   f"(visibility {row[0]} s, dead-letter queue {row[1]}, max_receives {row[2]})")
            conn.executemany("INSERT OR IGNORE INTO sizes VALUES (?, 0)", [(name,), (dlq,)])
        return SCHEME + name

    def url(self, name: str) -> str | None:
        with self._transaction("url", immediate=False) as conn:
            found = conn.execute("SELECT 1 FROM queues WHERE name = ?", (name,)).fetchone()
        return SCHEME + name if found else None

    def names(self, prefix: str) -> list[str]:
        with self._transaction("names", immediate=False) as conn:
            rows = conn.execute("SELECT name FROM queues WHERE substr(name, 1, ?) = ?", (len(prefix), prefix))
            return sorted(row[0] for row in rows)

    def arn(self, url: str) -> str:
        name = self._name(url)
        with self._transaction("arn", immediate=False) as conn:
            self._queue(conn, name, "arn")
        return _ARN + name

    def delete(self, name: str) -> None:
        """Delete the queue and its dead-letter queue at once; their messages go PURGE_BATCH at
        a time, with this call and the calls that follow. Idempotent."""
        queues = (name, f"{name}-dlq")
        with self._transaction("delete") as conn:
            if conn.execute("DELETE FROM queues WHERE name IN (?, ?)", queues).rowcount:
                conn.execute("DELETE FROM sizes WHERE name IN (?, ?)", queues)
                conn.executemany("INSERT OR IGNORE INTO purging VALUES (?)", [(q,) for q in queues])
            self._purge(conn)

    @staticmethod
    def _purge(conn: sqlite3.Connection) -> None:
        """Remove up to PURGE_BATCH messages of deleted queues (and forget up to 4 emptied)."""
        budget = PURGE_BATCH
        for (name,) in conn.execute("SELECT name FROM purging LIMIT 4").fetchall():
            removed = conn.execute("DELETE FROM messages WHERE id IN (SELECT id FROM messages WHERE queue = ? "
                                   "LIMIT ?)", (name, budget)).rowcount
            budget -= removed
            if budget == 0:
                return
            conn.execute("DELETE FROM purging WHERE name = ?", (name,))

    # -- messages -----------------------------------------------------------------------------

    def send(self, url: str, bodies: Iterable[str]) -> int:
        """Send every body, all or none (StorageError if one is empty or over SQS's 1 MiB)."""
        name, bodies = self._name(url), list(bodies)
        for body in bodies:
            if not body or len(body.encode()) > _MAX_BODY:
                raise StorageError(f"SQLite queues send: a message of {len(body.encode())} bytes is refused "
                                   f"(1 to {_MAX_BODY}); nothing was sent to {url}")
        with self._transaction("send") as conn:
            self._queue(conn, name, "send")
            now = self._clock()
            conn.executemany("INSERT INTO messages (queue, body, receipt, receive_count, visible_at) "
                             "VALUES (?, ?, NULL, 0, ?)", [(name, body, now) for body in bodies])
            conn.execute(_GROW, (len(bodies), name))
            self._purge(conn)
        return len(bodies)

    def receive(self, url: str, max_messages: int = 10, wait_s: int = 1,
                visibility_s: int | None = None) -> list[Message]:
        """Up to `max_messages` (at most 10) visible messages, oldest first, each hidden for
        `visibility_s` (the queue's own when None); polls until `wait_s` has passed for one."""
        name, n = self._name(url), min(max_messages, _BATCH)
        if n < 1 or (visibility_s is not None and not 0 <= visibility_s <= _MAX_SECONDS):
            raise StorageError(f"SQLite queues receive: bad max_messages {max_messages} or visibility {visibility_s}")
        deadline = time.monotonic() + max(wait_s, 0)
        while True:
            if self._any_visible(name):
                messages = self._take(name, n, visibility_s, "receive")
                if messages:
                    return messages
            if time.monotonic() >= deadline:
                return []
            time.sleep(_POLL_S)

    def _any_visible(self, name: str) -> bool:
        """Whether a receive may find something: a read, so idle pollers take no write lock."""
        with self._transaction("receive", immediate=False) as conn:
            self._queue(conn, name, "receive")
            row = conn.execute("SELECT 1 FROM messages WHERE queue = ? AND visible_at <= ? LIMIT 1",
                               (name, self._clock())).fetchone()
        return row is not None

    def _take(self, name: str, n: int, visibility_s: int | None, call: str) -> list[Message]:
        """Receive up to n visible messages (longest visible first) in one IMMEDIATE transaction,
        each with a fresh receipt, hidden for its visibility timeout. One received `max_receives`
        times goes to the dead-letter queue instead (as SQS does at a receive). Reads only the
        messages it hands out or moves."""
        with self._transaction(call) as conn:
            queue = self._queue(conn, name, call)
            now = self._clock()
            hidden_until = now + (queue.visibility_s if visibility_s is None else visibility_s)
            messages: list[Message] = []
            taken: list[int] = []  # a look (visibility 0) leaves them visible: not to be taken twice
            while len(messages) < n:
                rows = conn.execute("SELECT id, body, receive_count FROM messages INDEXED BY messages_visible "
                                    "WHERE queue = ? AND visible_at <= ? AND id NOT IN "
                                    f"({','.join('?' * len(taken))}) ORDER BY visible_at, id LIMIT ?",
                                    (name, now, *taken, n - len(messages))).fetchall()
                redriven = 0
                for message_id, body, count in rows:
                    if queue.dlq is not None and queue.max_receives is not None and count >= queue.max_receives:
                        self._redrive(conn, message_id, body, name, queue.dlq, now)
                        redriven += 1
                        continue
                    receipt = secrets.token_hex(16)
                    conn.execute("UPDATE messages SET receipt = ?, receive_count = ?, visible_at = ? WHERE id = ?",
                                 (receipt, count + 1, hidden_until, message_id))
                    messages.append(Message(body, receipt, count + 1, SCHEME + name))
                    taken.append(message_id)
                if not redriven:  # every row handed out, or none left: no need to look again
                    break
            self._purge(conn)
        return messages

    @staticmethod
    def _redrive(conn: sqlite3.Connection, message_id: int, body: str, source: str, target: str, now: float) -> None:
        """One message to the end of its dead-letter queue, as a new message."""
        conn.execute("INSERT INTO messages (queue, body, receipt, receive_count, visible_at) VALUES (?, ?, NULL, 0, ?)",
                     (target, body, now))
        conn.execute("DELETE FROM messages WHERE id = ?", (message_id,))
        conn.executemany(_GROW, [(-1, source), (1, target)])

    @staticmethod
    def _move(conn: sqlite3.Connection, source: str, target: str, now: float, where: str = "",
              args: tuple[int, ...] = ()) -> int:
        """Move the visible messages of `source` (those `where` selects) to the end of `target`,
        in their order, as new messages: visible, never received."""
        selected = f"queue = ? AND visible_at <= ? {where}"
        conn.execute("INSERT INTO messages (queue, body, receipt, receive_count, visible_at) "
                     f"SELECT ?, body, NULL, 0, ? FROM messages WHERE {selected} ORDER BY id",
                     (target, now, source, now, *args))
        moved: int = conn.execute(f"DELETE FROM messages WHERE {selected}", (source, now, *args)).rowcount
        conn.executemany(_GROW, [(-moved, source), (moved, target)])
        return moved

    def delete_message(self, url: str, receipt: str) -> None:
        """Delete the message this receipt names; none (deleted, received again since, or its queue
        gone) is not an error."""
        name = self._name(url)
        with self._transaction("delete_message") as conn:
            deleted = conn.execute("DELETE FROM messages WHERE queue = ? AND receipt = ?", (name, receipt)).rowcount
            conn.execute(_GROW, (-deleted, name))

    def retry_later(self, message: Message, delay_s: int = 0) -> None:
        """Make a received message visible again after `delay_s`; a receipt that no longer names
        it (deleted, or received again since) changes nothing."""
        name = self._name(message.queue_url)
        if not 0 <= delay_s <= _MAX_SECONDS:
            raise StorageError(f"SQLite queues retry_later: bad delay {delay_s} s")
        with self._transaction("retry_later") as conn:
            self._queue(conn, name, "retry_later")
            conn.execute("UPDATE messages SET visible_at = ? WHERE queue = ? AND receipt = ?",
                         (self._clock() + delay_s, name, message.receipt))

    def counts(self, url: str) -> QueueCounts:
        """The queue's messages waiting and in flight: exact, but for more than COUNT_CAP in
        flight, when COUNT_CAP is said and the rest counted as waiting (the total stays exact)."""
        name = self._name(url)
        with self._transaction("counts", immediate=False) as conn:
            self._queue(conn, name, "counts")
            size = conn.execute("SELECT messages FROM sizes WHERE name = ?", (name,)).fetchone()
            total = size[0] if size else 0
            (in_flight,) = conn.execute("SELECT COUNT(*) FROM (SELECT 1 FROM messages INDEXED BY messages_visible "
                                        "WHERE queue = ? AND visible_at > ? LIMIT ?)",
                                        (name, self._clock(), COUNT_CAP)).fetchone()
        return QueueCounts(int(total) - int(in_flight), int(in_flight))

    def peek(self, url: str, limit: int = 100) -> list[Message]:
        """Up to `limit` messages, oldest first, looked at and left visible. A look counts as a
        receive (as on SQS), towards the dead-letter limit too; each message's receipt deletes it.
        One transaction: a crash never leaves them hidden."""
        return self._take(self._name(url), max(limit, 0), 0, "peek")

    def move_all(self, source_url: str, target_url: str) -> int:
        """Move every visible message of one queue to the end of another (a dead-letter queue back
        to its queue), as new messages, in one transaction; returns the count."""
        source, target = self._name(source_url), self._name(target_url)
        if source == target:
            raise StorageError(f"SQLite queues move_all: {source_url} is both source and target")
        with self._transaction("move_all") as conn:
            queue = self._queue(conn, source, "move_all")
            self._queue(conn, target, "move_all")
            now = self._clock()
            if queue.dlq is not None and queue.max_receives is not None and queue.dlq != target:
                self._move(conn, source, queue.dlq, now, "AND receive_count >= ?", (queue.max_receives,))
            return self._move(conn, source, target, now)
