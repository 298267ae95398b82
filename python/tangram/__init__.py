# SPDX-License-Identifier: Apache-2.0
"""Tangram: per-head KV-cache budgets, head-group paging and an AOT decode split.

The bindings (``tangram._tangram``) wrap the same C++ headers engines embed. Errors carry the C++
message: invalid arguments raise ``ValueError`` (``ParseError`` for files), misuse raises
``UsageError``, and "does not fit" is a ``None`` / ``False`` return, never an exception.
"""
from __future__ import annotations

import os
from pathlib import Path

from ._tangram import *  # noqa: F401,F403
from ._tangram import ParseError, UsageError, __version__  # noqa: F401

_HERE = Path(__file__).resolve().parent


def data_dir() -> Path:
    """The bundled data folder (``profiles/<scorer>/<model>.json``).

    ``TANGRAM_DATA_DIR`` overrides it; an installed wheel carries the profiles in ``tangram/data``.
    """
    env = os.environ.get("TANGRAM_DATA_DIR")
    if env:
        return Path(env)
    installed = _HERE / "data"
    if installed.is_dir():
        return installed
    return _HERE.parent.parent / "data"  # a source checkout (python/tangram -> repository)


def profile_path(name: str) -> Path:
    """Path of a bundled retention profile, e.g. ``"snapkv/llama-3.1-8b-instruct"``."""
    path = data_dir() / "profiles" / (name if name.endswith(".json") else name + ".json")
    if not path.is_file():
        known = sorted(str(p.relative_to(data_dir() / "profiles"))
                       for p in (data_dir() / "profiles").glob("*/*.json"))
        raise ValueError(f"profile: no bundled profile {name!r} (bundled: {', '.join(known)})")
    return path
