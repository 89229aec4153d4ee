"""Checks that the interpreter Rust embeds has the pinned packages.

The Rust bridge calls `check_environment()` before its first real call, so a
venv with another coremltools fails with a message that names the package and
both versions instead of producing a subtly different package.
"""

import logging
import os
import re
import sys
from importlib import metadata

#: Packages whose exact version the exported artifacts depend on.
PINNED = {"coremltools": "9.0"}


class EnvironmentError_(RuntimeError):
    """The Python environment does not match the project's pins."""


def check_environment(pins=None):
    """Return installed versions of the pinned packages and numpy.

    Raises `EnvironmentError_` naming each package that is missing or at
    another version than pinned.
    """
    pins = PINNED if pins is None else pins
    found, problems = {}, []
    for name, want in pins.items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            problems.append(f"{name} is not installed (pinned {want})")
            continue
        found[name] = have
        if have != want:
            problems.append(f"{name} {have} is installed, the project pins {want}")
    if problems:
        raise EnvironmentError_(
            "; ".join(problems) + ". Run `make setup` to create the project's .venv."
        )
    found["numpy"] = metadata.version("numpy")
    return found


#: What coremltools logs at import when its native Core ML bindings
#: (`libcoremlpython`, macOS only) are absent: one line per proxy class.
_PROXY_MISSING = re.compile(r"Failed to load '?_ML\w+Proxy'?")


class _MissingProxyFilter(logging.Filter):
    """Drops coremltools' import-time "Failed to load _ML...Proxy" warnings
    about the macOS-only bindings; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        missing = "libcoremlpython" in msg or "Remote device functionality" in msg
        return not (record.levelno == logging.WARNING and missing and _PROXY_MISSING.match(msg))


def quiet_coremltools(platform: str = sys.platform) -> bool:
    """Keep coremltools from writing over ane-export's own output.

    Everywhere: its pass pipelines' tqdm progress bars ("Running MIL ...
    pipeline", three to nine a function) are off unless `TQDM_DISABLE` is set
    already (ane-export reports its own progress). Off macOS: the warnings
    that its macOS-only bindings cannot load (eight lines at import that read
    like errors) are dropped; only those: the filter matches the message and
    the missing module, at WARNING. Returns whether that filter was installed.
    Call before coremltools (and tqdm) are imported."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    if platform == "darwin":
        return False
    log = logging.getLogger("coremltools")
    if not any(isinstance(f, _MissingProxyFilter) for f in log.filters):
        log.addFilter(_MissingProxyFilter())
    return True
