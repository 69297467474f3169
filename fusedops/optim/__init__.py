"""Fused optimizers (FusedAdam, FusedAdamW)."""
