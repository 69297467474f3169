"""Plug-ins for other libraries' extension points (never imported by ``import fusedops``).

- ``fusedops.integrations.transformers.register_attention()``: registers fusedops' window
  attention as the Hugging Face attention implementation ``"fusedops"``.
"""
