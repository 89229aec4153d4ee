"""Checks that the interpreter Rust embeds has the pinned packages.

The Rust bridge calls `check_environment()` before its first real call, so a
venv with another coremltools fails with a message that names the package and
both versions instead of producing a subtly different package.
"""

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
