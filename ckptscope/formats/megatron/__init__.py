"""Megatron checkpoints: torch_dist and legacy per-rank readers, the layout rules both share, and the writers."""
