"""argparse types shared by the CLI's commands (kept apart from them: `pyengine demo` need not
import the broker to parse its flags)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole_number(minimum: int, maximum: int | None = None, *, meaning: str = "",
                 unit: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number from `minimum` to `maximum` (`meaning` of the minimum
    said when a value is below it)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}{meaning}" if meaning
                                             else f"{value} is not at least {minimum}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{value} is more than {maximum}{unit}")
        return value
    return parse
