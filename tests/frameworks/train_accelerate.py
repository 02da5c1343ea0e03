"""Train a few steps under HF Accelerate with stoker's loader (run by test_frameworks.py:
``python train_accelerate.py OUT`` for one process, under ``torchrun`` for two)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from frameworks_data import BATCH, EPOCHS, Numbers, finish, out_dir, record  # noqa: E402

from stoker.loader import DataLoader  # noqa: E402

torch.manual_seed(0)
# built before the process group exists, as user scripts do
loader = DataLoader(Numbers(), batch_size=BATCH, shuffle=True)


def main() -> None:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    assert prepared is loader, f"Accelerate replaced the loader with {type(prepared)}"
    epochs = []
    for epoch in range(EPOCHS):
        prepared.set_epoch(epoch)
        seen = []
        for batch in prepared:
            loss = model(batch["x"]).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            seen += batch["i"].tolist()
        epochs.append(seen)
    record(out_dir(), accelerator.process_index, accelerator.num_processes, epochs)
    finish()


if __name__ == "__main__":
    main()
