"""Train a few steps with Lightning's Trainer.fit on stoker's loader (run by
test_frameworks.py: ``python train_lightning.py OUT DEVICES``; with 2 devices Lightning starts
the second process itself, with WORLD_SIZE and LOCAL_RANK but no RANK)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from frameworks_data import BATCH, EPOCHS, Numbers, finish, out_dir, record  # noqa: E402

from stoker.loader import DataLoader  # noqa: E402


def main() -> None:
    import lightning as L

    L.seed_everything(0)
    # built before the process group exists (and before the second process is started); one
    # process worker, forked after Lightning installed its SIGTERM handler: the interpreter's
    # exit must still be able to stop it
    loader = DataLoader(Numbers(), batch_size=BATCH, shuffle=True, num_workers=1)
    devices = int(sys.argv[2])

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.seen: list[list[int]] = [[] for _ in range(EPOCHS)]

        def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
            self.seen[self.current_epoch] += batch["i"].tolist()
            return self.layer(batch["x"]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Model()
    trainer = L.Trainer(accelerator="cpu", devices=devices,
                        strategy="ddp" if devices > 1 else "auto", max_epochs=EPOCHS,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, train_dataloaders=loader)
    used = trainer.train_dataloader
    record(out_dir(), trainer.global_rank, trainer.world_size, model.seen,
           loader=f"{type(used).__module__}.{type(used).__qualname__}",
           sampler=type(used.sampler).__name__)
    finish()


if __name__ == "__main__":
    main()
