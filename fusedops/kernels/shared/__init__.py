"""Helpers that kernels and the ops' references share: below both layers, so kernels never
import ``fusedops.ops``. Pure functions of shapes and constants (Philox, window geometry, NMS
buffer plans, reduction chunking), no op wiring."""
