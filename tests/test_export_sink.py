"""The webhook sink (`serve --export-webhook`): every receipt reaches the receiver, by id, none
missing, each body signed; a receiver that is down, then answers 500s, then accepts loses
nothing; a `serve` SIGKILLed and restarted in between sends again only what was in flight.

Real parts only: a real HTTP receiver on loopback (`http.server` on a thread, checking each
body's HMAC with its own `hmac` call), real stores on SQLite and PostgreSQL, a real
`loopwarden serve --http` process. Waits poll the receiver or `export-status --json` with a
bounded deadline; the lease logic runs on a manual clock.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import BASIC_POLICY, OPERATOR
from prometheus_client.parser import text_string_to_metric_families
from support import cli, cli_env, free_port, kill_server, start_server, stop_server

from loopwarden.clients.admin import open_store
from loopwarden.errors import InvalidInput
from loopwarden.exports.sink import Pacing, WebhookSink, sending
from loopwarden.exports.targets import ExportTarget, export_target, verify_signature
from loopwarden.kernel.store.store import Store
from loopwarden.loops.lifecycle import OpenLoopRequest, open_loop
from loopwarden.observe.telemetry import Telemetry

pytestmark = [pytest.mark.anyio, pytest.mark.backends]

SECRET = b"s3cret-shared-with-the-siem-0123456789"
DEADLINE = 60.0  # seconds any one wait may take before the test fails


def wait_for(what: str, done: Callable[[], Any], seconds: float = DEADLINE) -> Any:
    """Poll `done()` until it is truthy (its value is returned), failing after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        value = done()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds}s: {what}")
        time.sleep(0.05)


async def await_for(what: str, done: Callable[[], Any], seconds: float = DEADLINE) -> Any:
    with anyio.fail_after(seconds):
        while not (value := await done()):
            await anyio.sleep(0.02)
    return value


# --- a receiver ---------------------------------------------------------------------------------


@dataclass
class Delivery:
    body: bytes
    headers: dict[str, str]

    @property
    def ids(self) -> list[str]:
        return [event["id"] for event in json.loads(self.body)]

    def signed(self) -> bool:
        """The signature, checked the way a receiver would write it (not with loopwarden's)."""
        stamp = self.headers["x-loopwarden-timestamp"]
        mac = hmac.new(SECRET, stamp.encode() + b"." + self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(self.headers["x-loopwarden-signature"], "sha256=" + mac)


@dataclass
class Receiver:
    """A webhook receiver on a loopback port: `refuse` answers 500 to that many POSTs first,
    then every POST is accepted (200) and kept."""

    port: int = field(default_factory=free_port)
    refuse: int = 0
    refused: int = 0
    accepted: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    http: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/ingest"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver.lock:
                    if receiver.refused < receiver.refuse:
                        receiver.refused += 1
                        status = 500
                    else:
                        receiver.accepted.append(Delivery(body, headers))
                        status = 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()

    def ids(self) -> list[str]:
        with self.lock:
            return [rid for delivery in self.accepted for rid in delivery.ids]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    yield made
    made.stop()


async def seal_loops(store: Store, count: int, prefix: str) -> None:
    for i in range(count):
        request = OpenLoopRequest(objective="o", policy=BASIC_POLICY, loop_id=f"{prefix}-{i}")
        await open_loop(store, OPERATOR, request)
    await store.integrate()  # the sink sends what is in the tree, in its order


async def journal_ids(store: Store) -> list[str]:
    return await store.read(lambda r: [row.receipt_id for row in r.iter_journal()])


# --- the lease (a manual clock) -----------------------------------------------------------------


async def test_one_holder_at_a_time_a_stale_lease_is_taken_over_and_the_cursor_never_goes_back(
    store, clock
):
    def take(holder: str) -> Any:
        return store.write(lambda tx: tx.cursors.take_export_lease("siem", holder, "http://x", 60))

    def advance(holder: str, index: int) -> Any:
        return store.write(lambda tx: tx.cursors.advance_export("siem", holder, index, 1, 60))

    first = await take("a")
    assert first is not None and not first.took_over and first.cursor.exported == -1
    assert await take("b") is None  # a's lease is live
    assert await advance("a", 5)
    clock.advance(59)
    assert await take("b") is None
    clock.advance(2)  # a let its lease expire
    taken = await take("b")
    assert taken is not None and taken.took_over and taken.cursor.exported == 5
    assert not await advance("a", 9)  # a lost the lease: it cannot move the cursor
    assert not await store.write(lambda tx: tx.cursors.note_export_failure("siem", "a", "HTTP 500"))
    assert await advance("b", 3)  # an older acknowledgement never moves the cursor back
    cursor = await store.read(lambda r: r.export_cursor("siem"))
    assert (cursor.exported, cursor.holder, cursor.sent) == (5, "b", 2)
    assert await store.write(lambda tx: tx.cursors.release_export_lease("siem", "b"))
    again = await take("a")  # released: free at once, and no takeover
    assert again is not None and not again.took_over


# --- the sink in-process --------------------------------------------------------------------------


def metric(telemetry: Telemetry, name: str) -> float:
    exposition = telemetry.metrics()
    assert exposition is not None
    for family in text_string_to_metric_families(exposition[0].decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("sink") == "siem":
                return sample.value
    return 0.0


async def test_a_receiver_down_then_failing_then_up_gets_every_receipt_once_and_signed(
    store, receiver
):
    await seal_loops(store, 5, "early")
    telemetry = Telemetry(tracing=False, metrics=True, version="test")
    target = ExportTarget("siem", receiver.url, SECRET)
    fast = Pacing(batch=3, poll=0.02, first_retry=0.01, longest_retry=0.05, timeout=5)
    sink = WebhookSink(store, target, observer=telemetry, pacing=fast)

    async def cursor() -> Any:
        return await store.read(lambda r: r.export_cursor("siem"))

    async with sending(sink):
        down = await await_for("a refused connection", cursor)
        await await_for("a refused connection", lambda: _error_is(cursor, "connection failed"))
        assert down.exported == -1
        receiver.refuse = 3
        receiver.start()
        await await_for("three 500s", lambda: _error_is(cursor, "HTTP 500"))
        await seal_loops(store, 4, "late")
        expected = await journal_ids(store)
        await await_for("every receipt", lambda: _all_in(receiver, expected))
        done = await await_for("the cursor at the end", lambda: _caught_up(cursor, expected))
        await await_for("no lag", lambda: _no_lag(telemetry))
    done = await cursor()
    assert receiver.refused == 3
    assert Counter(receiver.ids()) == Counter(expected)  # every one, and each once
    assert all(d.signed() for d in receiver.accepted)
    assert {d.headers["content-type"] for d in receiver.accepted} == {
        "application/cloudevents-batch+json"
    }
    assert max(len(d.ids) for d in receiver.accepted) <= 3
    assert (done.error, done.holder, done.sent) == (None, None, len(expected))  # released
    assert done.target == f"http://127.0.0.1:{receiver.port}"  # the origin only, no path
    assert metric(telemetry, "loopwarden_export_sent_total") == len(expected)
    assert metric(telemetry, "loopwarden_export_failures_total") >= 4
    assert metric(telemetry, "loopwarden_export_lag_receipts") == 0


async def _error_is(cursor: Callable[[], Any], error: str) -> bool:
    found = await cursor()
    return found is not None and found.error == error


async def _all_in(receiver: Receiver, expected: list[str]) -> bool:
    return set(expected) <= set(receiver.ids())


async def _no_lag(telemetry: Telemetry) -> bool:
    return metric(telemetry, "loopwarden_export_lag_receipts") == 0


async def _caught_up(cursor: Callable[[], Any], expected: list[str]) -> Any:
    found = await cursor()
    return found if found is not None and found.exported == len(expected) - 1 else None


def test_a_signature_verifies_only_for_its_body_secret_and_a_fresh_timestamp():
    from loopwarden.exports.targets import signature

    body, stamp = b'[{"id":"r1"}]', "1767225600"
    header = signature(SECRET, stamp, body)
    assert verify_signature(SECRET, stamp, body, header, now=1767225600 + 299)
    assert not verify_signature(SECRET, stamp, body + b" ", header, now=1767225600)
    assert not verify_signature(b"another-secret-0123456", stamp, body, header, now=1767225600)
    assert not verify_signature(SECRET, stamp, body, header, now=1767225600 + 301)
    assert not verify_signature(SECRET, "not-a-time", body, header, now=1767225600)


@pytest.mark.parametrize(
    ("url", "secret", "env", "message"),
    [
        ("ftp://siem.example/x", "s" * 16, {}, "http:// or https://"),
        ("siem.example/x", "s" * 16, {}, "absolute"),
        ("https://siem.example/x", None, {}, "needs a shared secret"),
        ("https://siem.example/x", "short", {}, "at least 16 bytes"),
        (None, "s" * 16, {}, "only applies with --export-webhook"),
    ],
)
def test_a_bad_webhook_configuration_is_refused_without_quoting_url_or_secret(
    tmp_path, url, secret, env, message
):
    secret_file = None
    if secret is not None:
        secret_file = tmp_path / "secret"
        secret_file.write_text(secret + "\n")
        secret_file.chmod(0o600)
    with pytest.raises(InvalidInput, match=message) as refused:
        export_target(url, secret_file, None, env)
    assert "siem.example" not in str(refused.value)
    assert secret is None or secret not in str(refused.value)


def test_the_webhook_and_its_secret_come_from_the_environment_and_stay_out_of_repr():
    env = {"LOOPWARDEN_EXPORT_WEBHOOK": "https://u:pw@siem.example:8088/hec?token=t"}
    env["LOOPWARDEN_EXPORT_SECRET"] = SECRET.decode()
    target = export_target(None, None, None, env)
    assert target is not None and target.secret == SECRET and target.name == "webhook"
    assert target.origin == "https://siem.example:8088"
    assert "pw" not in repr(target) and "token" not in repr(target) and "s3cret" not in repr(target)
    assert export_target(None, None, None, {}) is None


# --- a real serve, SIGKILLed and restarted ------------------------------------------------------


def export_status(home: Path, store: tuple[str, ...]) -> dict[str, Any]:
    done = cli("export-status", "--home", str(home), *store, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    status: dict[str, Any] = json.loads(done.stdout)
    return status


def sink_of(home: Path, store: tuple[str, ...]) -> dict[str, Any] | None:
    sinks = export_status(home, store)["sinks"]
    return sinks[0] if sinks else None


class Sealer:
    """Seals receipts (opens loops) in this process, on its own thread, until stopped: the
    store is shared with the server, which writes and sends meanwhile."""

    def __init__(self, home: Path, store: str | None) -> None:
        self.home, self.store = home, store
        self.stop = threading.Event()
        self.sealed = 0
        self.thread = threading.Thread(target=lambda: anyio.run(self._run), daemon=True)

    async def _run(self) -> None:
        async with open_store(self.home, store=self.store) as opened:
            while not self.stop.is_set():
                await seal_loops(opened, 1, f"live-{self.sealed}")
                self.sealed += 1
                await anyio.sleep(0.02)

    def __enter__(self) -> Sealer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def test_a_killed_and_restarted_serve_delivers_every_receipt_duplicates_only_across_the_kill(
    tmp_path, receiver, store_url
):
    home, logs = tmp_path / "home", tmp_path / "logs"
    store = () if store_url.endswith(".db") else ("--store", store_url)
    secret = tmp_path / "export.secret"
    secret.write_bytes(SECRET + b"\n")
    secret.chmod(0o600)
    anyio.run(_seal_first, home, store)
    args = ("--export-webhook", receiver.url, "--export-secret-file", str(secret))
    args += ("--export-lease", "2", *store)
    env = cli_env()
    served = start_server(home, logs, *args, env=env)
    try:
        with Sealer(home, store[1] if store else None) as sealer:
            wait_for("a refused connection", lambda: (sink_of(home, store) or {}).get("last_error"))
            assert sink_of(home, store)["last_error"] == "connection failed"
            receiver.refuse = 3
            receiver.start()
            wait_for("500s", lambda: receiver.refused == 3)
            wait_for("deliveries", lambda: len(receiver.accepted) >= 3)
            kill_server(served)
            before_kill, at_kill = receiver.ids(), sealer.sealed
            persisted = sink_of(home, store)["exported"]
            wait_for("receipts sealed while it is down", lambda: sealer.sealed >= at_kill + 5)
            served = start_server(home, logs, *args, env=env)
            count = sealer.sealed
            wait_for("receipts sealed after the restart", lambda: sealer.sealed >= count + 10)
        expected = _ids(home, store)
        wait_for("every receipt", lambda: set(expected) <= set(receiver.ids()))
        wait_for("the cursor at the end", lambda: sink_of(home, store)["lag"] == 0)
    finally:
        stop_server(served)
    # uvicorn ends a graceful stop by re-raising SIGTERM (a hung one would have been SIGKILLed)
    assert served.process.returncode == -signal.SIGTERM, served.stderr()
    _assert_delivered(receiver, expected, before_kill, persisted, home, store)
    assert SECRET.decode() not in served.stderr() and "/ingest" not in served.stderr()


async def _seal_first(home: Path, store: tuple[str, ...]) -> None:
    async with open_store(home, store=store[1] if store else None) as opened:
        await seal_loops(opened, 3, "first")


def _ids(home: Path, store: tuple[str, ...]) -> list[str]:
    done = cli("events", "--home", str(home), *store)
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["id"] for line in done.stdout.splitlines()]


def _assert_delivered(
    receiver: Receiver,
    expected: list[str],
    before_kill: list[str],
    persisted: int,
    home: Path,
    store: tuple[str, ...],
) -> None:
    """Every receipt arrived, each body signed; an id arrived twice only if it was delivered
    before the kill past the cursor the killed server had persisted."""
    got = Counter(receiver.ids())
    assert set(expected) <= set(got), "a receipt is missing"
    assert all(d.signed() for d in receiver.accepted)
    index = {rid: i for i, rid in enumerate(expected)}
    assert max(Counter(before_kill).values()) == 1  # no duplicate without a kill
    in_flight = {rid for rid in before_kill if index[rid] > persisted}
    twice = {rid for rid, n in got.items() if n > 1}
    assert twice <= in_flight, "a duplicate that no kill explains"
    assert max(got.values()) <= 2
    status = sink_of(home, store)
    assert status is not None and status["lease_holder"] is None  # released on SIGTERM
    assert (status["lag"], status["last_error"]) == (0, None)
