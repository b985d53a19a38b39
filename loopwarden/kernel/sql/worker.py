"""A dedicated thread fed by a queue: the store's writer, and PostgreSQL's readers.

The event loop hands a job to the thread and awaits a future the thread resolves
(`call_soon_threadsafe`): one queue hop each way, with no thread pool to borrow a thread from
and no capacity limiter to pass (measured on a 2-vCPU VM: ~35-50 µs against ~67-316 µs for
`anyio.to_thread.run_sync`; `python -m bench --only kernel` reports the hop).

The thread takes jobs in arrival order. Jobs that may share a transaction (`groupable`) and
wait together are handed over as one batch: that is the store's group commit. A job the
awaiting task gave up on while it was still queued is withdrawn and never runs; once the thread
has taken a job it runs to its end (a retry with the idempotency key finds what it did).

`asyncio` is imported by the methods that await: the hook command builds a store (and so a
worker it never starts) in a process that runs no event loop and should not pay for one.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

QUEUED, TAKEN, WITHDRAWN = 0, 1, 2


class Job:
    """One call waiting for the thread: `fn` and how it ended (`result` or `error`). A job run
    on the caller's own thread (`Store.write_now`) has no future to resolve."""

    __slots__ = ("attempts", "error", "fn", "future", "groupable", "result", "state")

    def __init__(
        self, fn: Callable[..., Any], future: asyncio.Future[Any] | None, groupable: bool
    ) -> None:
        self.fn = fn
        self.future = future
        self.groupable = groupable
        self.state = QUEUED
        self.result: Any = None
        self.error: BaseException | None = None
        self.attempts = 0  # times the group handler gave it back to be run again


GroupHandler = Callable[[list[Job]], list[Job]]
"""Runs a batch of groupable jobs on the worker thread, setting each one's `result` or `error`,
and returns those it could not run now (the thread runs them next, before anything queued
after them, and delivers the others at once); never raises."""

_STOP = object()


class Worker:
    """`threads` threads (one by default) running queued jobs. A job that is not groupable runs
    alone (`fn()`, its result or exception kept); groupable jobs waiting together go to
    `group` as one batch (only with one thread, which keeps the batches in arrival order).
    Start with `start()`, end with `await stop()` (what is queued runs first)."""

    def __init__(
        self,
        name: str,
        group: GroupHandler | None = None,
        *,
        threads: int = 1,
        max_batch: int = 64,
    ) -> None:
        if group is not None and threads != 1:
            raise ValueError("a grouping worker has one thread")
        self._group = group
        self._max_batch = max_batch
        self._queue: SimpleQueue[Any] = SimpleQueue()
        self._lock = threading.Lock()  # guards Job.state between the loop and the threads
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        self._stopped = False

    def depth(self) -> int:
        """Jobs queued and not yet taken (approximate: read without a lock)."""
        return self._queue.qsize()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    async def call(self, fn: Callable[[], Any], *, groupable: bool = False) -> Any:
        """Run `fn` on a worker thread (in a batch with other groupable jobs if `groupable`)
        and return its result, or raise its exception. Cancelled while still queued, the job
        is withdrawn; cancelled later, it still runs to its end."""
        if self._stopped:
            raise RuntimeError("the worker is stopped")
        import asyncio

        future = asyncio.get_running_loop().create_future()
        job = Job(fn, future, groupable)
        self._queue.put(job)
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            with self._lock:
                if job.state == QUEUED:
                    job.state = WITHDRAWN
            raise
        if job.error is not None:
            raise job.error
        return job.result

    async def stop(self) -> None:
        """Run what is queued, then end the threads."""
        if self._stopped:
            return
        self._stopped = True
        for _ in self._threads:
            self._queue.put(_STOP)
        import asyncio

        loop = asyncio.get_running_loop()
        for thread in self._threads:
            if thread.is_alive():
                await loop.run_in_executor(None, thread.join)

    def _take(self, job: Job) -> bool:
        with self._lock:
            if job.state == WITHDRAWN:
                return False
            job.state = TAKEN
            return True

    def _run(self) -> None:
        held: deque[Any] = deque()  # taken off the queue while gathering a batch, not yet run
        while True:
            item = held.popleft() if held else self._queue.get()
            if item is _STOP:
                return
            if not self._take(item):
                continue
            batch = [item]
            if item.groupable and self._group is not None:
                while len(batch) < self._max_batch:
                    try:
                        nxt = self._queue.get_nowait()
                    except Empty:
                        break
                    if nxt is _STOP or not nxt.groupable:
                        held.append(nxt)
                        break
                    if self._take(nxt):
                        batch.append(nxt)
                again = self._group(batch)
                if again:
                    held.extendleft(reversed(again))
                    batch = [job for job in batch if job not in again]
            else:
                try:
                    item.result = item.fn()
                except BaseException as exc:  # delivered to the awaiting task
                    item.error = exc
            _deliver(batch)


def _deliver(batch: list[Job]) -> None:
    """Wake the awaiting tasks: one call into each event loop for the whole batch."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[Any]]] = {}
    for job in batch:
        if job.future is not None:
            by_loop.setdefault(job.future.get_loop(), []).append(job.future)
    for loop, futures in by_loop.items():
        with suppress(RuntimeError):  # that event loop has closed: no one is waiting
            loop.call_soon_threadsafe(_resolve, futures)


def _resolve(futures: list[asyncio.Future[Any]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)
