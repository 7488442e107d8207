"""`python -m pyengine ...` is the `pyengine` command (for environments without the script)."""

import sys

from pyengine.cli import main

sys.exit(main())
