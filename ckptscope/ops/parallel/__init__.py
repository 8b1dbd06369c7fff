"""The same convert / merge / diff / verify plans on many processes and nodes, under ``torchrun``.

Work is split by bytes (``partition``) into whole output files (or whole diff pairs): the output
layout depends on the plan alone, never on the world size, so N ranks write the same bytes as one
process. Ranks talk through ``torch.distributed`` with gloo (``group``): no process pool of our own.
Nothing here imports torch unless torchrun launched the process.
"""
