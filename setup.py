"""Build of the compiled core, hora._native.

Metadata lives in pyproject.toml; this file only declares the extension, which
compiles with a C++17 compiler and pybind11 and against nothing else.

HORA_SANITIZE=address,undefined builds it with those sanitizers instead, for
``make test-asan`` (which builds into its own folder, never over the real one).

The sources compile in parallel, one job per core (``HORA_BUILD_JOBS`` sets
the number): setuptools' own ``-j`` runs extensions in parallel, and this is
one extension.
"""

import os
from pathlib import Path

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup

ParallelCompile("HORA_BUILD_JOBS").install()

NATIVE_SOURCES = sorted(str(path) for path in Path("native").glob("*.cc"))

SANITIZE = os.environ.get("HORA_SANITIZE", "")
if SANITIZE:
    # -O1 keeps the stacks readable; vptr checks misfire across pybind11's shared objects.
    sanitizer_flags = [f"-fsanitize={SANITIZE}", "-fno-sanitize=vptr", "-fno-sanitize-recover=all"]
    compile_args = ["-O1", "-g", "-fno-omit-frame-pointer", *sanitizer_flags]
    link_args = sanitizer_flags
else:
    compile_args, link_args = ["-O3"], []

setup(
    ext_modules=[
        Pybind11Extension(
            "hora._native",
            NATIVE_SOURCES,
            cxx_std=17,
            extra_compile_args=[*compile_args, "-Wall", "-Wextra", "-fvisibility=hidden"],
            extra_link_args=link_args,
        )
    ],
    cmdclass={"build_ext": build_ext},
)
