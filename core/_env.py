"""Reading ``HORA_*`` variables (or Horovod's ``HOROVOD_*`` names for them), with errors that quote the value."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["flag", "lookup", "number"]


def lookup(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """``(variable, text)`` of ``HORA_<name>``, else ``HOROVOD_<name>``, if either is set and not empty."""
    for key in (f"HORA_{name}", f"HOROVOD_{name}"):
        if environ.get(key, "") != "":
            return key, environ[key]
    return None


def number(environ: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    """The variable as a number of at least ``minimum``; ``default`` when unset."""
    found = lookup(environ, name)
    if found is None:
        return default
    key, text = found
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{key}={text!r} is not a number; expected a number >= {minimum:g}.") from None
    if value < minimum:
        raise ValueError(f"{key}={text!r} is below the minimum of {minimum:g}.")
    return value


def flag(environ: Mapping[str, str], name: str) -> bool:
    """The variable as a boolean (1/0, true/false, yes/no, on/off); False when unset."""
    found = lookup(environ, name)
    if found is None:
        return False
    key, text = found
    if text.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if text.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{key}={text!r} is not a boolean; expected 1/0, true/false, yes/no or on/off.")
