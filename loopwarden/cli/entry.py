"""The `loopwarden` command's entry point: `loopwarden hook HOST …` (started by agent hosts
for every tool call) goes straight to the forwarder to the home's local hook server
(`hook_local.py`; with `--server`, to a running `serve --http`: `hook_forward.py`), both of
which import little beyond the standard library, or with `--in-process` to the lean handler
that decides itself; `loopwarden hook server` (the local server the hooks start) to that
server; everything else to the admin CLI."""

from __future__ import annotations

import os
import sys

from loopwarden.hostnames import NAMES as HOSTS  # the names alone: no host module is imported

TYPE_CHECKING = False  # `typing` is not imported: the forwarder needs nothing beyond `sys`
if TYPE_CHECKING:
    from typing import NoReturn

PLUGINS_OFF = ("__all__", "1", "true")  # the values with which pydantic loads no plugin


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) >= 2 and argv[0] == "hook" and argv[1] in HOSTS:
        if "--server" in argv:  # to a running `serve --http`
            from loopwarden.clients.hook_forward import main as forward

            leave(forward(argv[1:]))
        if "--in-process" in argv:  # the store opened here, for this one event
            lean()
            from loopwarden.clients.hook_command import main as hook_main

            leave(hook_main(argv[1:]))
        from loopwarden.clients.hook_local import main as local  # the home's local server

        leave(local(argv[1:]))
    if argv[:2] == ["hook", "server"]:  # that server, started by the hooks (not lean: it stays)
        from loopwarden.server.hook_socket import main as serve_hooks

        sys.exit(serve_hooks(argv[2:]))
    from loopwarden.cli.root import main as cli_main

    cli_main()


def leave(code: int) -> NoReturn:
    """End a hook process once its answer is written, without the interpreter's teardown.

    By then the store is closed (its last transaction committed or rolled back) and the answer
    is flushed here; what the teardown would still do is free, one by one, the tens of
    thousands of objects the imports built (the final garbage collection runs even with the
    collector off): 40–60 ms of every tool call on this machine, for nothing the host sees.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def lean() -> None:
    """Set up a process that answers one hook event and exits (the host starts one for every
    tool call the model makes) to import and allocate no more than the decision needs.

    - No cyclic garbage collection: the imports build tens of thousands of objects, and the
      collector would walk them over and over (~10 ms here) to free next to nothing before the
      process exits anyway.
    - No pydantic plugins: pydantic looks plugins up in the installed packages' entry points
      on the first model it builds, which imports `importlib.metadata` (and with it `email`,
      `zipfile`, `csv`: ~10 ms here). loopwarden uses none, so the lookup is turned off, and,
      when it is (whether by us or by the caller), pydantic's loader is stood in for by one
      that loads nothing: exactly what the real one answers under that setting, without the
      imports. A caller who names plugins to skip instead keeps the real loader.
    """
    import gc

    gc.disable()
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    if os.environ["PYDANTIC_DISABLE_PLUGINS"] in PLUGINS_OFF and "pydantic" not in sys.modules:
        loader = type(sys)("pydantic.plugin._loader", "No pydantic plugins (loopwarden hook).")
        loader.get_plugins = tuple  # type: ignore[attr-defined]  # get_plugins() -> ()
        sys.modules[loader.__name__] = loader
