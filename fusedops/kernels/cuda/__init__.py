"""CUDA kernels (plain ``.cu`` launchers) and their one torch binding, built on first use."""
