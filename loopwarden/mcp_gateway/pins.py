"""Tool pins: the digest of each downstream tool's description as an operator admitted it.

A tool's digest is the sha256 of the RFC 8785 bytes of `{name, description, inputSchema}` as
the downstream lists it: what the model reads and what it fills in. The gateway serves a tool
only while its digest equals its pin. An unpinned tool is hidden until an operator pins it
(`loopwarden gateway pin`), or, if the servers file's loop policy says `[gateway] pin =
"first_sight"`, pinned the first time the gateway sees it; a tool whose digest changed is
hidden and refused until an operator pins it again, and the change is sealed (`mcp.tool_changed`).

Pins live in one JSON file beside the servers file (`servers.pins.json`; `gateway.pins` names
another), meant to be reviewed and versioned with it. Writes take an exclusive lock on the file
and replace it atomically, so gateways pinning on first sight at once keep every pin.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from loopwarden.canonical import digest_of
from loopwarden.clock import format_time
from loopwarden.errors import LoopwardenError

PINS_VERSION = 1
PinStatus = Literal["pinned", "unpinned", "changed"]


class PinsError(LoopwardenError, code="pins_unreadable"):
    """The pins file cannot be read or written."""


def tool_digest(tool: Mapping[str, Any]) -> str:
    """The digest of a listed tool (a `tools/list` entry as JSON): name, description, input
    schema. `SealError` (never a digest of nothing) if they cannot be made canonical."""
    return digest_of(
        {
            "name": tool.get("name"),
            "description": tool.get("description"),
            "inputSchema": tool.get("inputSchema"),
        }
    )


@dataclass(frozen=True)
class Pin:
    digest: str
    pinned_at: str
    by: str  # "operator", or "first_sight"


class Pins:
    """The pins file: read on every check (a pin made by another process counts at once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cache: tuple[float, dict[str, dict[str, Pin]]] | None = None

    def read(self) -> dict[str, dict[str, Pin]]:
        """Server → tool → pin. A missing file is no pins; an unreadable one `PinsError`."""
        try:
            stamp = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise PinsError(f"cannot read the pins file {self.path}: {exc.strerror}") from None
        if self._cache is not None and self._cache[0] == stamp:
            return self._cache[1]
        try:
            document = json.loads(self.path.read_text())
            pins = {
                server: {tool: Pin(**pin) for tool, pin in tools.items()}
                for server, tools in document["tools"].items()
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PinsError(
                f"the pins file {self.path} is not a pins file ({type(exc).__name__})"
            ) from None
        self._cache = (stamp, pins)
        return pins

    def status(self, server: str, tool: str, digest: str) -> tuple[PinStatus, str | None]:
        """Whether a tool with `digest` is pinned, unpinned or changed; and the pinned digest."""
        pin = self.read().get(server, {}).get(tool)
        if pin is None:
            return "unpinned", None
        return ("pinned" if pin.digest == digest else "changed"), pin.digest

    def pin(self, digests: Mapping[tuple[str, str], str], by: str, now: datetime) -> int:
        """Pin each (server, tool) to its digest; the number of pins that changed. With
        `by="first_sight"`, only tools not pinned yet are pinned (never a changed one)."""
        with self._locked():
            pins = {s: dict(t) for s, t in self.read().items()}
            changed = 0
            for (server, tool), digest in sorted(digests.items()):
                known = pins.get(server, {}).get(tool)
                if known is not None and (known.digest == digest or by == "first_sight"):
                    continue
                pins.setdefault(server, {})[tool] = Pin(digest, format_time(now), by)
                changed += 1
            if changed:
                self._write(pins)
            return changed

    def unpin(self, server: str, tool: str | None = None) -> int:
        """Forget the pins of `server` (or one tool of it); how many were forgotten."""
        with self._locked():
            pins = {s: dict(t) for s, t in self.read().items()}
            tools = pins.get(server, {})
            gone = [t for t in tools if tool is None or t == tool]
            for name in gone:
                del tools[name]
            if not tools:
                pins.pop(server, None)
            if gone:
                self._write(pins)
            return len(gone)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        lock = self.path.with_name(self.path.name + ".lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise PinsError(f"cannot lock the pins file {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._cache = None
            yield
        finally:
            os.close(fd)

    def _write(self, pins: dict[str, dict[str, Pin]]) -> None:
        document = {
            "version": PINS_VERSION,
            "tools": {
                server: {tool: vars(pin) for tool, pin in sorted(tools.items())}
                for server, tools in sorted(pins.items())
            },
        }
        try:
            fd, temp = tempfile.mkstemp(dir=self.path.parent, prefix=".pins-")
            with os.fdopen(fd, "w") as out:
                json.dump(document, out, indent=2)
                out.write("\n")
            os.replace(temp, self.path)
        except OSError as exc:
            raise PinsError(f"cannot write the pins file {self.path}: {exc.strerror}") from None
        self._cache = None
