"""NeMo 1.x ``.nemo`` archives (NeMo 2.0 checkpoint dirs open through the Megatron torch_dist reader)."""
