"""Reproducible training, proven: two runs of the same job give bitwise-identical loss curves.

A small torch MLP is trained for two epochs on a sharded synthetic tabular dataset twice:

* run A goes straight through;
* run B is interrupted twice mid-epoch. Each time it had saved a checkpoint (model, optimizer and
  ``loader.state_dict()``) a few steps earlier, trained on past it, then "crashed" (its loader
  and model are thrown away). A fresh model, optimizer and loader restore the checkpoint with
  ``load_state_dict`` and carry on; the steps after the checkpoint are computed again.

Both runs write a ledger. ``stoker audit`` must pass on each (replay, coverage, resumes) and on
the pair (no divergence), and the two loss curves must be bitwise identical.

Run: ``python examples/reproducible_training.py [--workdir DIR] [--rows N]``.
"""

from __future__ import annotations

import argparse
import io
import struct
import sys
import tempfile
from pathlib import Path

import torch

from stoker.loader import DataLoader, ReadOptions
from stoker.sharder import shard
from stoker.sharder.synthetic import write_tabular_parquet
from stoker.tools.audit import audit
from stoker.tools.audit.html import render_html
from stoker.tools.audit.report import terminal_summary

FEATURES = [f"f{i}" for i in range(16)]
EPOCHS = 2
BATCH = 64
SEED = 1234


def make_dataset(workdir: Path, rows: int) -> Path:
    """Synthetic tabular Parquet -> stoker shards (several shards, so the shuffle matters)."""
    src, dst = workdir / "source.parquet", workdir / "dataset"
    if not (dst / "manifest.json").exists():
        write_tabular_parquet(src, rows, seed=0)
        shard(src, dst, rows_per_shard=max(rows // 12, 1), progress=False)
    return dst


def new_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(len(FEATURES), 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def new_loader(data: Path, ledger: Path) -> DataLoader:
    return DataLoader(str(data), batch_size=BATCH, shuffle=True, seed=SEED, columns=["label"],
                      num_workers=2, ledger=str(ledger),
                      read=ReadOptions(features=FEATURES))


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: dict) -> float:
    x = torch.nan_to_num(torch.as_tensor(batch["features"]))
    y = torch.as_tensor(batch["label"]).long() % 3
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    loss = loss.detach()
    return loss.item()


def checkpoint(model: torch.nn.Module, opt: torch.optim.Optimizer, loader: DataLoader,
               losses: list[float]) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "loader": loader.state_dict(), "losses": list(losses)}, buf)
    return buf.getvalue()


def run(data: Path, ledger: Path, crash_at: tuple[int, ...] = (),
        lost_steps: int = 3) -> list[float]:
    """Train for EPOCHS; at each global step in ``crash_at`` save a checkpoint, train on for
    ``lost_steps`` more steps, then crash and resume from the checkpoint."""
    model, opt = new_model()
    loader = new_loader(data, ledger)
    losses: list[float] = []
    pending = sorted(crash_at)
    saved: bytes | None = None
    while loader.epoch < EPOCHS:
        crashed = False
        for batch in loader:
            losses.append(train_step(model, opt, batch))
            if pending and len(losses) == pending[0]:
                saved = checkpoint(model, opt, loader, losses)
            if pending and len(losses) == pending[0] + lost_steps:
                pending.pop(0)
                crashed = True
                break
        if crashed:
            loader.close()  # the process "dies": everything in memory is lost
            del model, opt, loader
            state = torch.load(io.BytesIO(saved), weights_only=False)
            model, opt = new_model()
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            loader = new_loader(data, ledger)
            loader.load_state_dict(state["loader"])
            losses = state["losses"]
    loader.close()
    return losses


def bits(values: list[float]) -> bytes:
    return b"".join(struct.pack("<d", v) for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="where data, ledgers and reports go")
    parser.add_argument("--rows", type=int, default=6000, help="dataset rows")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="stoker-repro-"))
    workdir.mkdir(parents=True, exist_ok=True)
    data = make_dataset(workdir, args.rows)
    runs = workdir / "runs"
    for old in runs.glob("*.ledger"):
        old.unlink()  # a ledger appends: start each demonstration from an empty one
    steps = -(-args.rows // BATCH)
    losses_a = run(data, runs / "a.ledger")
    losses_b = run(data, runs / "b.ledger", crash_at=(steps // 3, steps + steps // 2))
    assert len(losses_a) == EPOCHS * steps, (len(losses_a), steps)
    assert bits(losses_a) == bits(losses_b), "loss curves differ"
    print(f"loss curves: {len(losses_a)} steps, bitwise identical "
          f"(first {losses_a[0]:.6f}, last {losses_a[-1]:.6f})")
    ok = True
    for name, report in (("a", audit(runs / "a.ledger")), ("b", audit(runs / "b.ledger")),
                         ("a-vs-b", audit(runs / "a.ledger", runs / "b.ledger"))):
        (workdir / f"audit-{name}.html").write_text(render_html(report), encoding="utf-8")
        (workdir / f"audit-{name}.json").write_text(report.to_json(), encoding="utf-8")
        print(terminal_summary(report))
        ok &= report.reproducible
    for name in ("a", "b"):
        size = (runs / f"{name}.ledger").stat().st_size
        print(f"ledger {name}: {size} bytes")
    print(f"reports in {workdir}")
    assert ok, "an audit failed"
    return 0


if __name__ == "__main__":
    sys.exit(main())
