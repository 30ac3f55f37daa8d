"""``manage.py redlock list`` and ``show`` never write a lock name's control characters to the
terminal: names come from HTTP clients (request-lock keys are filled from URL values), and an
escape sequence in one could retitle the window, clear the screen, hide or fake table rows."""

from __future__ import annotations

import json
import re
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from django_redlock import locks

pytestmark = pytest.mark.urls("tests.support.cli_urls")

#: What must never reach the terminal raw: C0 (ESC, CR, LF, BEL, NUL...), DEL, C1, the bidi
#: embeddings/overrides and isolates, and the line and paragraph separators.
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def run(*args: str) -> str:
    out = StringIO()
    call_command("redlock", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def lines_without_controls(output: str) -> list[str]:
    """The output's lines, each checked to hold no unsafe character."""
    lines = output.rstrip("\n").split("\n")
    for line in lines:
        assert not UNSAFE.search(line), repr(line)
    return lines


def test_a_name_planted_through_a_url_prints_escaped() -> None:
    """A client POSTing to ``/order/<ESC>]0;pwned<BEL><ESC>[2J<LF>.../`` holds the lock
    ``order:\\x1b]0;pwned\\x07\\x1b[2J\\n...`` while the view runs: ``list`` prints it escaped
    on one table row, ``show`` on one line, and ``--json`` still gives the exact name."""
    tail = uuid.uuid4().hex[:8]
    response = Client().get(f"/order/%1B%5D0%3Bpwned%07%1B%5B2J%0A{tail}/")
    assert response.status_code == 200
    seen = response.json()
    name = f"order:\x1b]0;pwned\x07\x1b[2J\n{tail}"
    assert seen["name"] == name
    shown = f"order:\\x1b]0;pwned\\x07\\x1b[2J\\n{tail}"
    table = lines_without_controls(seen["list"])
    assert len(table) == 2 and table[0].startswith("ALIAS") and shown in table[1]
    show = lines_without_controls(seen["show"])
    assert [line for line in show if line.startswith("NAME")] == [f"NAME{' ' * 12}{shown}"]
    assert show[-3] == "HOLDERS (1):" and len(show) == 13
    assert [row["name"] for row in json.loads(seen["json"])] == [name]


def test_names_taken_directly_print_escaped_one_row_each(unique_name: str) -> None:
    """C0, DEL, C1 and bidi controls in names taken with ``acquire()`` are printed escaped
    (ASCII controls as ``repr()`` writes them, the others as ``\\uXXXX``, which bash's
    ``$'...'`` reads back; a backslash doubled, so no two names print alike); one row per
    lock."""
    names = {
        f"{unique_name}:a\x1b[31mred": "a\\x1b[31mred",
        f"{unique_name}:b\rhidden\x08": "b\\rhidden\\x08",
        f"{unique_name}:c\u202eevil\u202c": "c\\u202eevil\\u202c",
        f"{unique_name}:d\x00\x7f\x85\x9b": "d\\x00\\x7f\\u0085\\u009b",
        f"{unique_name}:e\u2066x\u2069\ndefault  fake-row": "e\\u2066x\\u2069\\ndefault  fake-row",
        f"{unique_name}:f\\x1b\t\u2028": "f\\\\x1b\\t\\u2028",
    }
    manager = locks["multi"]
    leases = [manager.acquire(name, ttl=30, timeout=0) for name in names]
    try:
        table = lines_without_controls(run("list", "--using", "multi", "--prefix", unique_name))
        assert len(table) == 1 + len(names)
        for row, shown in zip(table[1:], sorted(names.values()), strict=True):
            assert f"{unique_name}:{shown}" in row
        for name, shown in names.items():
            show = lines_without_controls(run("show", name, "--using", "multi"))
            assert f"{unique_name}:{shown}" in show[1] and len(show) == 13
        rows = json.loads(run("list", "--using", "multi", "--prefix", unique_name, "--json"))
        assert sorted(row["name"] for row in rows) == sorted(names)
    finally:
        for lease in leases:
            lease.release()


def test_printable_names_print_as_they_are(unique_name: str) -> None:
    """Names without control characters (accents, CJK, emoji, quotes) are printed unchanged."""
    name = f"{unique_name}:café-注文-🔒-'\"-x y"
    with locks["default"].lock(name, ttl=30, timeout=0):
        assert name in run("list", "--using", "default", "--prefix", unique_name)
        assert f"NAME{' ' * 12}{name}" in run("show", name).split("\n")
