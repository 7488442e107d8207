"""Build the Cython hot path in core_ext/ (the rest of the metadata is in pyproject.toml)."""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

# Release builds are optimised; PYENGINE_DEBUG=1 builds with line tracing and no optimisation.
DEBUG = os.environ.get("PYENGINE_DEBUG") == "1"
COMPILE_ARGS = ["-O0", "-g"] if DEBUG else ["-O3"]
DIRECTIVES = {
    "language_level": "3",
    "boundscheck": DEBUG,
    "wraparound": False,
    "cdivision": True,
    "embedsignature": True,
    "linetrace": DEBUG,
}

MODULES = ["frames", "batch", "poskeys", "records"]

extensions = [
    Extension(
        f"core_ext.{name}",
        [f"core_ext/{name}.pyx"],
        extra_compile_args=COMPILE_ARGS,
        define_macros=[("CYTHON_TRACE_NOGIL", "1")] if DEBUG else [],
    )
    for name in MODULES
]

setup(ext_modules=cythonize(extensions, compiler_directives=DIRECTIVES, quiet=True))
