"""Triton kernels and their launchers, one module per op; imported only when selected."""
