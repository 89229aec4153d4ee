"""Python side of ane-export.

Rust owns reading checkpoints, preprocessing, the reference and the gates.
Python does only what needs coremltools: building and saving Core ML
packages (and, on a Mac, Core ML prediction and MLComputePlan). Every entry
point takes plain data and numpy arrays.
"""

from .environment import PINNED, EnvironmentError_, check_environment, quiet_coremltools

# Before anything imports coremltools: off macOS its import warns eight times
# that the macOS-only bindings are missing.
quiet_coremltools()

__all__ = ["PINNED", "EnvironmentError_", "check_environment", "quiet_coremltools"]
