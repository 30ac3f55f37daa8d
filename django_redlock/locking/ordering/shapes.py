"""The shape of a lock name: what the lock-order checker records edges between.

A name is masked, in this order (docs/production.md#ordering-locks):

1. a UUID written with dashes (``8-4-4-4-12`` hex digits, any case) becomes ``{uuid}``;
2. a run of 16 or more hex digits holding at least one decimal digit (a digest, a UUID
   without dashes) becomes ``{hex}``;
3. every other run of decimal digits becomes ``{n}``.

``order:42`` and ``order:7`` are both ``order:{n}``; ``v2:cart:0b7e...-...`` is
``v{n}:cart:{uuid}``. Two names of one shape count as one lock for ordering, so the checker
finds ``order:{n}`` then ``invoice:{n}`` in one place and the other order elsewhere, whatever
the ids were.

A lock taken from a template (``@lock("order:{pk}")``, a request lock's key, a ``LockedTask``'s
``lock_name``) has the template as its shape, with each field whose value masks whole (``42``,
a UUID, a digest) written as that mask: ``@lock("order:{pk}")`` with ``pk=42`` is
``order:{n}``, the same shape as ``lock(f"order:{pk}")``, so the two ways of taking one lock
are ordered together. A field of another value (a slug, a username) stays as written
(``cart:{user.username}``): its names are one shape, not one per user.
"""

from __future__ import annotations

import contextvars
import functools
import re
import string
from collections.abc import Mapping

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_HEX = re.compile(r"(?<![0-9a-zA-Z])(?=[a-fA-F]*[0-9])[0-9a-fA-F]{16,}(?![0-9a-zA-Z])")
_DIGITS = re.compile(r"[0-9]+")

#: The templates of the names this thread or task is about to take: ``{name: template}``, set
#: by the callers that fill templates (see :func:`expect`), read and cleared by :func:`shape`.
_EXPECTED: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "django_redlock_expected_shape", default=None
)


@functools.lru_cache(maxsize=4096)
def masked(name: str) -> str:
    """``name`` with its UUIDs, long hex runs and digit runs masked (see the module doc)."""
    name = _UUID.sub("{uuid}", name)
    name = _HEX.sub("{hex}", name)
    return _DIGITS.sub("{n}", name)


_WHOLE_MASK = re.compile(r"\{(?:n|uuid|hex)\}")


@functools.lru_cache(maxsize=1024)
def _template_parts(template: str) -> tuple[re.Pattern[str], tuple[str | None, ...]]:
    """A pattern matching the names ``template`` fills (a group per field), and its parts:
    a literal text masked, or None for a field (then the field as written follows). Raises
    ValueError for fields not split by literal text (``{a}{b}``: the name cannot be split)."""
    pattern: list[str] = []
    parts: list[str | None] = []
    after_field = False
    for literal, field, spec, conversion in string.Formatter().parse(template):
        pattern.append(re.escape(literal))
        if literal:
            parts.append(masked(literal))
        elif after_field and field is not None:
            raise ValueError("adjacent fields")
        after_field = field is not None
        if field is not None:
            pattern.append("(.*?)")
            conv = f"!{conversion}" if conversion else ""
            parts.extend([None, "{" + field + conv + (f":{spec}" if spec else "") + "}"])
    return re.compile("".join(pattern) + r"\Z", re.DOTALL), tuple(parts)


@functools.lru_cache(maxsize=4096)
def templated(name: str, template: str) -> str:
    """The shape of ``name``, filled from ``template`` (see the module doc); the template as
    written when the name cannot be split back into its fields."""
    try:
        pattern, parts = _template_parts(template)
    except ValueError:
        return template
    found = pattern.match(name)
    if found is None:
        return template
    out: list[str] = []
    group = 0
    fields = iter(parts)
    for part in fields:
        if part is not None:
            out.append(part)
            continue
        group += 1
        written = next(fields) or ""
        value = masked(found.group(group))
        out.append(value if _WHOLE_MASK.fullmatch(value) else written)
    return "".join(out)


def expect(name: str, template: str) -> None:
    """The next lock this thread or task takes, if it is ``name``, came from ``template``."""
    _EXPECTED.set({name: template})


def expect_all(templates: Mapping[str, str]) -> None:
    """The next set this thread or task takes (``limits()``, ``lock_many``) has these names,
    each filled from its template (``{name: template}``)."""
    _EXPECTED.set(dict(templates))


def shape(name: str) -> str:
    """The shape of ``name``, about to be taken: its template if :func:`expect` (or
    :func:`expect_all`) announced it, else the masked name. A name not announced drops the
    announcement (it was for a take that did not happen)."""
    expected = _EXPECTED.get()
    if expected is not None:
        template = expected.get(name)
        rest = {other: value for other, value in expected.items() if other != name}
        _EXPECTED.set(rest if template is not None and rest else None)  # never mutated: shared
        if template is not None:
            return templated(name, template)
    return masked(name)
