"""CUDA kernels (plain ``.cu`` launchers) and each op's torch binding, built on first use."""
