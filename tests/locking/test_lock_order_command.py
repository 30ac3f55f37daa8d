"""``manage.py redlock order``: the checker's records read from the nodes (text and JSON),
inverted pairs flagged with both stacks, ``--check``'s exit status, ``--clear``."""

from __future__ import annotations

import json
import warnings
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_redlock import lock
from django_redlock.locking import ordering
from tests.locking.test_lock_order import checker  # noqa: F401  (the fixture)


def run(*args: str) -> str:
    out = StringIO()
    call_command("redlock", "order", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def _invert(p: str) -> None:
    with lock(f"{p}:a:1", timeout=1), lock(f"{p}:b:1", timeout=1):
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with lock(f"{p}:b:2", timeout=1), lock(f"{p}:a:2", timeout=1):
            pass


def test_text_lists_edges_and_flags_inversions(checker: str) -> None:  # noqa: F811
    """The table names both edges of an inverted pair (processes, where first seen) and the
    tail prints both stacks; records made by this process are read back from the nodes."""
    p = checker
    with lock(f"{p}:c", timeout=1), lock(f"{p}:d", timeout=1):
        pass
    _invert(p)
    ordering.reset()  # what is printed comes from the nodes, not this process's memory
    out = run("--using", "default")
    assert "HELD" in out and "INVERTED" in out
    rows = [line for line in out.splitlines() if line.startswith(f"{p}:")]
    assert any(f"{p}:a:{{n}}" in r and f"{p}:b:{{n}}" in r and "yes" in r for r in rows)
    assert any(f"{p}:c" in r and f"{p}:d" in r and "yes" not in r for r in rows)
    assert f"Inverted: {p}:a:{{n}} <-> {p}:b:{{n}}" in out
    assert out.count("_invert") >= 2  # both first stacks


def test_json_and_check_status(checker: str) -> None:  # noqa: F811
    """--json: edges with held/taken/processes/inverted/first, and the inverted pairs;
    --check exits 3 (a one-line error) when a pair is inverted, 0 otherwise."""
    p = checker
    with lock(f"{p}:c", timeout=1), lock(f"{p}:d", timeout=1):
        pass
    run("--check")  # no inversion: status 0
    _invert(p)
    document = json.loads(run("--json", "--using", "default"))
    by_pair = {(e["held"]["shape"], e["taken"]["shape"]): e for e in document["edges"]}
    edge = by_pair[(f"{p}:a:{{n}}", f"{p}:b:{{n}}")]
    assert edge["inverted"] is True and edge["processes"] == 1
    assert edge["held"]["alias"] == "default" and "_invert" in edge["first"]["stack"]
    assert by_pair[(f"{p}:c", f"{p}:d")]["inverted"] is False
    assert document["inverted"] == [
        [
            {"alias": "default", "shape": f"{p}:a:{{n}}"},
            {"alias": "default", "shape": f"{p}:b:{{n}}"},
        ]
    ]
    with pytest.raises(CommandError, match="1 inverted lock order pair") as excinfo:
        run("--check")
    assert excinfo.value.returncode == 3


def test_clear_forgets_the_records(checker: str) -> None:  # noqa: F811
    p = checker
    _invert(p)
    assert "Cleared the lock-order records of 1 alias(es)." in run("--clear", "--using", "default")
    assert run("--using", "default").strip() == "No lock order is recorded."
    assert json.loads(run("--json")) == {"edges": [], "inverted": [], "cycles": []}
