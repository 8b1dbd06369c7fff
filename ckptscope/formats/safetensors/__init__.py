"""safetensors files: the header reader and the header-rewriting writer."""
