"""Kernel sources: ``triton/<op>.py`` (Triton kernels and launchers) and ``cuda/<op>.cu``."""
