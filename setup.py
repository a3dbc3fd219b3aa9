"""Build of the compiled core, hora._native.

Metadata lives in pyproject.toml; this file only declares the extension, which
compiles with a C++17 compiler and pybind11 and against nothing else.
"""

from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

NATIVE_SOURCES = sorted(str(path) for path in Path("native").glob("*.cc"))

setup(
    ext_modules=[
        Pybind11Extension(
            "hora._native",
            NATIVE_SOURCES,
            cxx_std=17,
            extra_compile_args=["-O3", "-Wall", "-Wextra", "-fvisibility=hidden"],
        )
    ],
    cmdclass={"build_ext": build_ext},
)
