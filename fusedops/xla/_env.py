"""On/off switches of fusedops.xla read from the environment."""

from __future__ import annotations

import os

#: values that turn a switch off (case and surrounding spaces ignored)
OFF = ("0", "false", "off")


def switched_on(name: str) -> bool:
    """Whether the environment switch ``name`` is on: unset, or anything but ``0``/``false``/
    ``off``."""
    return os.environ.get(name, "1").strip().lower() not in OFF
