"""XLA lowerings of fusedops' own ops: ``fusedops/xla/fused/<op>.py`` holds the op's math in
jax.numpy/lax, forward and backward, for ``torch.ops.fusedops.<name>`` and its backward op, so
a fused op inside a ``partial_trace`` / ``xla_trace`` region stays inside the one XLA program.
They live here, above the ops they lower (they import ``fusedops.xla.lower_table``), not beside
the Triton and CUDA kernels: nothing under ``fusedops/kernels/`` imports ``fusedops.xla``, and
only ``fusedops.xla`` (``lower``) imports these modules.

Each module registers with ``fusedops.xla.lower.register`` on import; ``fusedops.xla.lower``
imports the module of every op in ``fusedops.ops.OP_MODULES`` (importing these imports jax).
A lowering takes the op's arguments in order, tensors as ``jax.Array`` (the ``backend``
argument is ignored), and returns what the op returns. An op that writes its arguments in place
(``adam_step``) registers with ``mutates=True`` and returns ``{argument name: new value}``.

``tests/xla/test_fusedops_lowerings.py`` finds every ``fusedops::`` op and checks its lowering
against the op under ``partial_trace(fullgraph=True)``, forward and backward. Its sample inputs
come from the test's own table or from a ``samples(name)`` function in the op's module here: a
list of argument tuples for forward op ``name`` (small, random each call, covering the op's
variants; one function for the several ops a module may lower).
"""
