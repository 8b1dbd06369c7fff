"""DeepSpeed ZeRO stage 1/2/3 checkpoint dirs (FORMATS.md §7)."""
