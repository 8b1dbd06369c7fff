"""The pickle machinery every format shares: the safe stub unpickler, torch.save's object tree,
DTensor / ShardedTensor decoding, re-pickling, and the explicit ``--trust-pickle`` path."""
