"""fusedops' code for other libraries, one package per library (never imported by
``import fusedops``; the hooks import each ``<library>.hooks``, which imports neither torch nor
the library):

- ``transformers``: the hooks' targets (``hooks``: QuickGELU, the RMSNorm family, Swin), the
  RMSNorm class table (``rms_norm_classes.json``) and the fused RMSNorm variants, the fused
  Swin / Swinv2 classes (``swin``), and fusedops' window attention as the Hugging Face attention
  implementation ``"fusedops"`` (``register_attention()``, ``attention``).
- ``timm``: the hooks' targets and the fused Swin classes.
- ``torchvision``, ``mmcv``: the NMS and deformable convolution functions the hooks replace
  (mmcv's with adapters keeping its signatures).
- ``open_clip``: its QuickGELU class in the ``quick_gelu`` hook.
"""
