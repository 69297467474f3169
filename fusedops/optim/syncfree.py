"""Sync-free optimizers under the names TorchAcc's ``syncfree`` module gives them:
``syncfree.Adam``, ``syncfree.AdamW`` and ``syncfree.SGD``.

Each is fusedops' fused optimizer itself (re-exported, one object: ``syncfree.SGD is
fusedops.optim.FusedSGD``), a subclass of the torch optimizer of that name whose step never
waits for the device: the learning rate may be a tensor read on the device, and under
``torch.amp.GradScaler`` the gradients are unscaled and an overflowing step is skipped on the
device (``found_inf``), without the host synchronisation torch's GradScaler makes for other
optimizers::

    from fusedops.optim import syncfree

    optimizer = syncfree.AdamW(model.parameters(), lr=1e-3)
"""

from __future__ import annotations

from fusedops.optim.adam import FusedAdam as Adam
from fusedops.optim.adam import FusedAdamW as AdamW
from fusedops.optim.sgd import FusedSGD as SGD

__all__ = ["Adam", "AdamW", "SGD"]
