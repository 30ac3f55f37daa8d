"""A rolling upgrade: processes running the previous engine and processes running this one share
the nodes, and no name is ever held by two of them (a lock, a write lease, more permits than the
semaphore has, a reader beside a writer), whichever side each is on.

The previous engine is the tree of :data:`PREVIOUS` (the last one whose scripts differ from
this tree's), extracted from git into a temporary folder and put first on the worker's
``PYTHONPATH``. Each worker notes when it entered and left each section on the machine's
monotonic clock (shared by every process); the test checks the intervals against each kind's
rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]
#: the previous engine: the landed tree before the lanes for every kind and the leaner read
#: and write scripts
PREVIOUS = "65a12fa"

_WORKER = """
import json, os, sys, time
import django
django.setup()
from django_redlock import locks
from django_redlock.exceptions import LockNotAcquired

kind, seconds, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
where = os.path.dirname(os.path.abspath(sys.modules["django_redlock"].__file__))
options = {"lock": {}, "write": {"rw": "write"}, "read": {"rw": "read"}, "permit": {"permits": 2}}
manager, spans, refused = locks["default"], [], 0
name = "permits" if kind == "permit" else "shared"
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        lease = manager.acquire(name, ttl=10, timeout=2, **options[kind])
    except LockNotAcquired:
        refused += 1
        continue
    entered = time.monotonic_ns()
    time.sleep(0.001)
    left = time.monotonic_ns()
    held = lease.release()
    spans.append((entered, left, held, lease.token))
with open(out, "w") as f:
    json.dump({"where": where, "spans": spans, "refused": refused}, f)
"""


@pytest.fixture(scope="module")
def previous_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous engine's ``django_redlock`` package, extracted from git."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", PREVIOUS, "django_redlock"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    folder = tmp_path_factory.mktemp("previous-engine")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


@pytest.fixture
def mixed(
    redis_node_factory: Any, redlock_alias: Any, request: pytest.FixtureRequest
) -> Iterator[tuple[dict[str, str], int]]:
    """The worker's environment for the nodes of ``request.param`` (1 or 3)."""
    nodes = redis_node_factory(request.param)
    # a generous NODE_TIMEOUT: fourteen workers on a loaded machine answer late, and a
    # release whose reply came after it would read unconfirmed (False), not held
    manager = redlock_alias(nodes, TTL=10, NODE_TIMEOUT=2.0)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "REDLOCK_JSON": json.dumps({"default": settings.REDLOCK[manager.alias]}),
    }
    yield env, request.param


def _overlaps(spans: list[tuple[int, int, str]]) -> list[tuple[Any, ...]]:
    """Sections that overlap in time and may not: anything on the name of a lock or a write
    lease beside it (both take the name alone), and more than two permits of the semaphore
    (a name of its own) at once."""
    bad = []
    shared = [s for s in spans if s[2] != "permit"]
    for a in (s for s in shared if s[2] in ("lock", "write")):
        for b in shared:
            if a is not b and a[0] < b[1] and b[0] < a[1]:
                bad.append((a, b))
    permits = sorted((s for s in spans if s[2] == "permit"), key=lambda s: s[0])
    for i, a in enumerate(permits):
        inside = [b for b in permits[:i] if b[1] > a[0]]
        if len(inside) >= 2:
            bad.append((a, *inside))
    return bad


@pytest.mark.parametrize("mixed", [1, 3], indirect=True, ids=["one node", "three nodes"])
def test_previous_and_this_engine_never_hold_a_name_together(
    mixed: tuple[dict[str, str], int], previous_engine: Path, tmp_path: Path
) -> None:
    env, _ = mixed
    # per side: 5 workers (14 Python processes took 11-14 s to start and run on 2 cores);
    # four permit workers in all for a semaphore of two
    kinds = ["lock", "write", "read", "permit", "permit"]
    workers = []
    for side in ("previous", "this"):
        path = f"{previous_engine}{os.pathsep}{ROOT}" if side == "previous" else str(ROOT)
        for i, kind in enumerate(kinds):
            out = tmp_path / f"{side}-{i}.json"
            # run from tmp_path: ``-c`` puts the working folder first on the path
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER, kind, "2", str(out)],
                env={**env, "PYTHONPATH": path}, cwd=tmp_path,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            workers.append((side, kind, out, proc))
    errors = {}
    for _, _, out, proc in workers:
        try:
            errors[out] = proc.communicate(timeout=60)[1]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    spans: list[tuple[int, int, str]] = []
    sections = {"previous": 0, "this": 0}
    for side, kind, out, proc in workers:
        assert proc.returncode == 0, errors[out]
        result = json.loads(out.read_text())
        expected = previous_engine if side == "previous" else ROOT
        assert Path(result["where"]).parent == expected  # each side runs its own engine
        for entered, left, held, _ in result["spans"]:
            assert held, (side, kind)  # every release found its lease still held
            spans.append((entered, left, kind))
        sections[side] += len(result["spans"])
    assert _overlaps(spans) == []
    # both sides took the names, each kind more than once
    assert sections["previous"] >= 10 and sections["this"] >= 10, sections
