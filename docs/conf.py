"""Sphinx configuration of Hora's documentation (``make docs``: warnings are errors)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
# Importing hora.tensorflow and hora.keras for the API reference loads TensorFlow; keep it quiet.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

project = "Hora"
author = "The Hora authors"
copyright = "2026, The Hora authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "hora_api",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

html_theme = "alabaster"
html_title = "Hora"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# The frameworks' own classes appear in signatures and bases; their docs are not ours to link.
nitpicky = False
