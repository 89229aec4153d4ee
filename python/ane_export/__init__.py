"""Python side of ane-export.

Rust owns reading checkpoints, preprocessing, the reference and the gates.
Python does only what needs coremltools: building and saving Core ML
packages (and, on a Mac, Core ML prediction and MLComputePlan). Every entry
point takes plain data and numpy arrays.
"""

from .environment import PINNED, EnvironmentError_, check_environment

__all__ = ["PINNED", "EnvironmentError_", "check_environment"]
