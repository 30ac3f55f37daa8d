"""Lock-name templates: ``"order:{order_id}"`` filled from a request's URL kwargs and user.

Whatever the values, a filled name is a valid lock name that no other values give, and it never
starts with the reserved ``__``. Each field's value is written as it is, except:

* ``%``, the template's separators (every non-alphanumeric character of its literal text, and the
  first character of the text between two fields), lone surrogates, and a ``_`` that would
  start the name are percent-encoded as UTF-8 bytes in upper-case hex (``:`` is ``%3A``);
* an empty value is ``%-``; a value followed directly by another field, or by text starting with
  ``%``, ends with ``%.``;
* a name of :data:`MAX_NAME_LENGTH` (512) characters or more keeps its first 446 characters and
  ends with ``%#`` and the SHA-256 of the whole name: 512 characters exactly.

So ``"order:{order_id}"`` gives ``order:42``. In a value ``%`` is always followed by two hex digits
or by one of ``-.#``, which makes each value and its end readable back from the name; names kept
as they are have at most 511 characters, so none is a hashed one.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Mapping
from typing import Any, NamedTuple

from django.core.exceptions import ImproperlyConfigured

from ..conf import MAX_NAME_LENGTH
from ..engine import RESERVED_MARK

USER_FIELD = "user"
_ROOT = re.compile(r"[^.\[]*")
_FORMATTER = string.Formatter()
EMPTY = "%-"
"""An empty value."""
END = "%."
"""Ends a value that another field, or text starting with ``%``, follows directly."""
HASHED = "%#"
"""Separates the kept start of an over-long name from its SHA-256."""
_DIGEST_LENGTH = 64
_LEADING = "_"


class _Field(NamedTuple):
    name: str
    root: str
    spec: str
    conversion: str | None


def _quote(match: re.Match[str]) -> str:
    return "".join(f"%{byte:02X}" for byte in match.group().encode("utf-8", "surrogatepass"))


class KeyTemplate:
    """A lock-name template such as ``"order:{order_id}"`` or ``"checkout:{user.pk}"``.

    Fields are URL keyword arguments, or ``user`` (``request.user``). Positional fields (``{}``,
    ``{0}``) and nested replacement fields are rejected when the template is built, and so is a
    template whose text starts with the reserved ``__``.
    """

    def __init__(self, template: Any, where: str) -> None:
        if not isinstance(template, str) or not template:
            raise ImproperlyConfigured(
                f"{where}: the lock key must be a non-empty str template such as "
                f"'order:{{order_id}}', not {template!r}."
            )
        self.template = template
        self.where = where
        try:
            template.encode("utf-8")
            parsed = list(_FORMATTER.parse(template))
        except UnicodeEncodeError as exc:
            raise self._invalid(f"contains a lone surrogate ({exc.reason})") from exc
        except ValueError as exc:
            raise self._invalid(
                f"is not a valid format string ({exc}). Write literal braces as '{{{{' and '}}}}'"
            ) from exc
        texts = [""]  # the literal text before, between and after the fields
        self._fields: list[_Field] = []
        for literal, field, spec, conversion in parsed:
            texts[-1] += literal
            if field is not None:
                self._fields.append(self._field(field, spec or "", conversion))
                texts.append("")
        if texts[0].startswith(RESERVED_MARK):
            raise self._invalid(
                f"starts with {RESERVED_MARK!r}, which is reserved for django-redlock's own keys"
            )
        self._texts = texts
        self.fields = frozenset(field.root for field in self._fields)
        self.uses_user = USER_FIELD in self.fields
        self.url_fields = self.fields - {USER_FIELD}
        between = texts[1:-1]
        special = {"%", *(c for text in texts for c in text if not c.isalnum())}
        special |= {text[0] for text in between if text}
        self._special = re.compile(
            "[" + "".join(map(re.escape, sorted(special))) + "\\ud800-\\udfff]"
        )
        self._ends = [not text or text[0] == "%" for text in between] + [False]
        self._guard_start = texts[0] in ("", _LEADING)

    def _invalid(self, why: str) -> ImproperlyConfigured:
        return ImproperlyConfigured(f"{self.where}: lock key template {self.template!r} {why}.")

    def _field(self, field: str, spec: str, conversion: str | None) -> _Field:
        root = _ROOT.match(field).group()  # type: ignore[union-attr]  # always matches
        if not root.isidentifier():
            raise self._invalid(
                f"has the field {{{field}}}; fields must name a URL keyword argument or 'user' "
                "(positional fields are not supported)"
            )
        if "{" in spec:
            raise self._invalid("nests a field inside a format spec, which is not supported")
        return _Field(field, root, spec, conversion)

    def __repr__(self) -> str:
        return f"KeyTemplate({self.template!r})"

    @property
    def shape(self) -> str:
        """The template with every field written ``{}``: two templates of one shape give the
        same name for equal values (``"order:{order_id}"`` and ``"order:{pk}"``)."""
        return "{}".join(text.replace("{", "{{").replace("}", "}}") for text in self._texts)

    def missing(self, available: Any) -> list[str]:
        """The URL fields the template needs that ``available`` (names) does not provide."""
        return sorted(self.url_fields - set(available))

    def fill(self, kwargs: Mapping[str, Any], user: Any = None) -> str:
        """The lock name for one request (see the module docstring for how values are written)."""
        missing = self.missing(kwargs)
        if missing:
            raise ImproperlyConfigured(
                f"{self.where}: lock key template {self.template!r} needs the URL keyword "
                f"argument(s) {', '.join(missing)}, but the matched URL provides "
                f"{sorted(kwargs) or 'none'}. Rename the template fields or the URL converters "
                "(manage.py check reports this at startup as django_redlock.E014)."
            )
        values = {name: kwargs[name] for name in self.url_fields}
        if self.uses_user:
            values[USER_FIELD] = user
        parts = [self._texts[0]]
        for index, field in enumerate(self._fields):
            parts.append(self._encode(self._format(field, values), first=index == 0))
            if self._ends[index]:
                parts.append(END)
            parts.append(self._texts[index + 1])
        name = "".join(parts)
        if len(name) < MAX_NAME_LENGTH:
            return name
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
        return f"{name[: MAX_NAME_LENGTH - len(HASHED) - _DIGEST_LENGTH]}{HASHED}{digest}"

    def _format(self, field: _Field, values: Mapping[str, Any]) -> str:
        try:
            value, _ = _FORMATTER.get_field(field.name, (), values)
            value = _FORMATTER.convert_field(value, field.conversion)
            return str(_FORMATTER.format_field(value, field.spec))
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise ImproperlyConfigured(
                f"{self.where}: lock key template {self.template!r} could not be filled: {exc!r}."
            ) from exc

    def _encode(self, text: str, first: bool) -> str:
        if not text:
            return EMPTY
        text = self._special.sub(_quote, text)
        if first and self._guard_start and text.startswith(_LEADING):
            text = f"%{ord(_LEADING):02X}{text[1:]}"
        return text
