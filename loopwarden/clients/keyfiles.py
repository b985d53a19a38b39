"""Public key files: what `keys export` writes is exactly what the verifying commands read.

Written by `keys export` (to stdout, or a file with `-o`):
- text, one key per line: `<base64 public key> <key id>`;
- with `--json`, one key: `{"key_id": …, "public_key": …}`; with `--all --json`,
  `{"keys": {key_id: base64, …}}`.

Read by `verify-bundle --key` (a key or a file) and `--trusted-keys FILE`, and by
`verify --trusted-keys FILE`, in any of those forms, and also `{key_id: base64, …}` and the
`keys show --json` document. A bare base64 key (no id) is accepted too. A key id written next
to a key must be that key's id: a mislabelled key is an error, never silently trusted (a
label that is not a key id, such as `{"prod": …}`, is just a name).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loopwarden.errors import KeyFileError, clip
from loopwarden.kernel.log.keys import Keyring, decode_public_key, key_id_for, public_key_b64

KEY_ID_PREFIX = "ed25519-"


def key_line(public_key: bytes) -> str:
    """One exported key: `<base64> <key id>`."""
    return f"{public_key_b64(public_key)} {key_id_for(public_key)}"


def read_keys(text: str) -> Keyring:
    """Every public key in `text` (any form above). `KeyFileError` if it holds none, or a
    malformed or mislabelled one."""
    stripped = text.strip()
    pairs = list(_json_pairs(_json(stripped)) if stripped.startswith("{") else _line_pairs(text))
    if not pairs:
        raise KeyFileError("no public key found")
    ring = Keyring()
    for label, encoded in pairs:
        if not isinstance(encoded, str):
            raise KeyFileError(f"key {label!r}: a public key is a base64 string")
        key_id = ring.add(decode_public_key(encoded))
        if isinstance(label, str) and label.startswith(KEY_ID_PREFIX) and label != key_id:
            raise KeyFileError(f"the key labelled {label!r} is {key_id} (a mislabelled key)")
    return ring


def read_key_argument(value: str) -> Keyring:
    """`--key VALUE`: the path of a key file if one exists there, else the key text itself."""
    path = Path(value)
    if not path.is_file():
        try:
            return read_keys(value)
        except KeyFileError:
            raise KeyFileError(
                f"{clip(value)!r} is neither a key file nor a base64 public key"
            ) from None
    return read_key_file(path)


def read_key_file(path: Path) -> Keyring:
    """`--trusted-keys FILE` (errors name the file)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise KeyFileError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return read_keys(text)
    except KeyFileError as exc:
        raise KeyFileError(f"{path}: {exc.message}") from None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise KeyFileError(f"malformed JSON ({exc.msg}, line {exc.lineno})") from None


def _json_pairs(data: Any) -> Iterator[tuple[Any, Any]]:
    if not isinstance(data, dict):
        raise KeyFileError("expected a JSON object of public keys")
    if "public_key" in data:  # `keys export --json`
        yield data.get("key_id"), data["public_key"]
        return
    keys = data.get("keys", data)
    if isinstance(keys, list):  # `keys show --json`
        for item in keys:
            if not isinstance(item, dict) or "public_key" not in item:
                raise KeyFileError("each item of keys[] needs a public_key")
            yield item.get("key_id"), item["public_key"]
    elif isinstance(keys, dict):  # {key_id: base64}
        yield from keys.items()
    else:
        raise KeyFileError("keys must be an object {key_id: base64} or a list")


def _line_pairs(text: str) -> Iterator[tuple[str | None, str]]:
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) > 2:
            raise KeyFileError(f"line {number}: expected '<base64 key> [key id]'")
        yield (words[1] if len(words) == 2 else None), words[0]
