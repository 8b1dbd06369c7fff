"""``diff``: pairing plan, streaming engine, metrics (CPU and CUDA) and the per-pair detail view."""
