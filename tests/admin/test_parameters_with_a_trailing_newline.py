"""A path or query parameter with a trailing newline is refused (400): Python's `$` matches
before a final newline, so `1%0A` was read as the integer 1 and `name%0A` passed a name's
pattern, where OpenAPI's (ECMA) patterns end at the end of the text."""

from __future__ import annotations

import pytest

from pyengine.admin.errors import AdminError
from pyengine.admin.names import NAME_SCHEMA
from pyengine.admin.validation import check, from_text


@pytest.mark.parametrize("text", ["1\n", "+1\n", "1\n\n", " 1", "1 "])
def test_an_integer_with_anything_around_it_is_refused(text):
    with pytest.raises(AdminError, match="expected an integer"):
        from_text(text, {"type": "integer"}, "coordinatorId")


def test_a_name_with_a_trailing_newline_is_refused():
    check("tenant-1", NAME_SCHEMA, "tenant")
    with pytest.raises(AdminError):
        check("tenant-1\n", NAME_SCHEMA, "tenant")


def test_integers_are_still_read():
    assert from_text("-12", {"type": "integer"}, "n") == -12
    assert from_text("+3", {"type": "integer"}, "n") == 3
