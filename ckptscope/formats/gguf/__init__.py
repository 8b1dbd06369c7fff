"""GGUF (llama.cpp / ggml) single-file models: header, KV metadata, tensor infos, block-quantised data."""
