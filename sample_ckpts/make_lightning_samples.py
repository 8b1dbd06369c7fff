#!/usr/bin/env python
"""Write a PyTorch Lightning checkpoint dir with Lightning itself, plus the model's own weights.

    python sample_ckpts/make_lightning_samples.py OUT_DIR

Needs ``lightning`` (tested with 2.6.6; not a dev dependency: the output is shipped in
``sample_ckpts/lightning/``). A ``LightningModule`` holding a tiny transformers Llama as
``self.model`` trains 4 steps on the CPU under ``Trainer`` with ``ModelCheckpoint(save_last=True)``
and AdamW + StepLR, which writes::

    OUT/lightning/ckpts/epoch=0-step=2.ckpt, epoch=1-step=4.ckpt   # ModelCheckpoint's default names
    OUT/lightning/ckpts/last.ckpt     # {"state_dict": {"model.<HF name>": ...}, "callbacks": {...},
                                      #  "optimizer_states": [...], "lr_schedulers": [...], "loops": {...},
                                      #  "epoch", "global_step", "hyper_parameters", ...}
    OUT/lightning/reference.safetensors   # the trained model's state_dict, by HF name
    OUT/lightning/hf_config/config.json   # its config (for convert --hf-config)

``reference.safetensors`` is the model after the last step (``last.ckpt`` and ``epoch=1-step=4.ckpt``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def write_lightning_sample(out: Path) -> Path:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from make_trainer_samples import tiny_model
    from safetensors.torch import save_file

    target = Path(out) / "lightning"

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.save_hyperparameters({"hidden": 32})
            self.model = tiny_model(seed=0)

        def training_step(self, batch, index):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1)}

    gen = torch.Generator().manual_seed(0)
    data = torch.utils.data.DataLoader([torch.randint(0, 100, (16,), generator=gen) for _ in range(8)], batch_size=4)
    module = Module()
    checkpoints = ModelCheckpoint(dirpath=str(target / "ckpts"), save_top_k=-1, every_n_train_steps=2,
                                  save_last=True)
    trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=1, callbacks=[checkpoints], logger=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, data)
    save_file({k: v.contiguous() for k, v in module.model.state_dict().items()}, str(target / "reference.safetensors"))
    module.model.config.save_pretrained(str(target / "hf_config"))
    return target


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip())
        raise SystemExit(2)
    print(write_lightning_sample(Path(sys.argv[1])))
