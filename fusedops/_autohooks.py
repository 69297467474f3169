"""Applied at interpreter start by ``fusedops_hooks.pth`` when FUSEDOPS_HOOKS is set.

``FUSEDOPS_HOOKS=all`` or ``name[:value],...``, for example
``quick_gelu:open_clip.transformer.QuickGELU``.
Never raises: a bad value is reported as a warning so the interpreter still starts.
"""

import os
import warnings

from fusedops import hooks

try:
    hooks.enable_from_spec(os.environ.get("FUSEDOPS_HOOKS", ""), at_startup=True)
except (ValueError, TypeError) as exc:
    warnings.warn(f"FUSEDOPS_HOOKS ignored: {exc}", stacklevel=1)
