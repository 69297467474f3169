"""timm: the hooks' targets (``hooks``) and the fused Swin classes (``swin``)."""
