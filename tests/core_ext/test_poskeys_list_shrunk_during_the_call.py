"""pack_positions over a list that an item's __index__ shrinks during the call raises, where
it read past the list's end. Found by an audit: the list itself is read (PySequence_Fast does
not copy lists), its length taken once up front, so the process died of a segmentation fault.
Run in a child process, which the crash would kill instead of the test run."""

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    from core_ext.poskeys import pack_positions

    for shrunk in ("ledger_ids", "entry_ids"):
        values = [1, 2, 3, 4]

        class Shrinking:
            def __index__(self):
                values.clear()
                return 7

        values[0] = Shrinking()
        args = (values, [1, 2, 3, 4]) if shrunk == "ledger_ids" else ([1, 2, 3, 4], values)
        try:
            pack_positions(*args)
        except RuntimeError as exc:
            print(exc)
""")


def test_a_list_shrunk_by_an_items_index_raises_instead_of_crashing():
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, f"the child died ({child.returncode}): {child.stderr[-2000:]}"
    assert child.stdout.splitlines() == ["ledger_ids changed size during the call",
                                         "entry_ids changed size during the call"]
