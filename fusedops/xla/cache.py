"""The JAX persistent compilation cache, on by default under a user-overridable directory.

``FUSEDOPS_XLA_CACHE_DIR`` picks the directory (default ``~/.cache/fusedops/xla``); an empty
value turns the cache off. A directory the user already gave JAX (``jax_compilation_cache_dir``)
is left alone.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path


def cache_dir() -> Path | None:
    """The directory compiled XLA programs are kept in, or None when turned off."""
    value = os.environ.get("FUSEDOPS_XLA_CACHE_DIR")
    if value is None:
        return Path.home() / ".cache" / "fusedops" / "xla"
    return Path(value).expanduser() if value else None


@functools.cache
def configure() -> Path | None:
    """Point JAX's persistent compilation cache at ``cache_dir()`` (once per process)."""
    import jax

    directory = cache_dir()
    if directory is None or jax.config.jax_compilation_cache_dir:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return directory
