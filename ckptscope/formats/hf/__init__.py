"""Hugging Face model directories (safetensors or pytorch_model*.bin shards, with or without an index)."""
