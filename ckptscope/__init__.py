"""ckptscope: see inside training checkpoints.

Importing the package is cheap on purpose: nothing here pulls in torch, numpy or textual.
Use ``ckptscope.formats.open_checkpoint`` to read a checkpoint and ``ckptscope.ops`` for the
operations built on top of it.
"""

__version__ = "0.1.0"
