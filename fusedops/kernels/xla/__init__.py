"""XLA lowerings of fusedops' own ops: ``kernels/xla/<op>.py`` holds the op's math in
jax.numpy/lax, forward and backward, for ``torch.ops.fusedops.<name>`` and its backward op, so
a fused op inside a ``partial_trace`` / ``xla_trace`` region stays inside the one XLA program.

Each module registers with ``fusedops.xla.lower.register`` on import; ``fusedops.xla.lower``
imports the module of every op in ``fusedops.ops.OP_MODULES`` (importing these imports jax).
A lowering takes the op's arguments in order, tensors as ``jax.Array`` (the ``backend``
argument is ignored), and returns what the op returns.
"""
