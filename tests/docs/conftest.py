from __future__ import annotations

from collections.abc import Iterator

import pytest

from pyengine.testing import ServeProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """`pyengine serve` as the quickstart starts it, on free ports, for one test module."""
    process = ServeProcess(tmp_path_factory.mktemp("docs") / "data")
    process.start()
    try:
        yield process
    finally:
        assert process.stop() == 0
