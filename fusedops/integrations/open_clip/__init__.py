"""open_clip: its QuickGELU class in the ``quick_gelu`` hook (``hooks``)."""
