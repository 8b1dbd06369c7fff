"""PyTorch Distributed Checkpoint dirs: the reader, ``.metadata`` parsing, and the metadata writers."""
