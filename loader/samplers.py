"""stoker's order seen as torch samplers: what frameworks inspect on a DataLoader.

Lightning replaces a loader's sampler with a ``DistributedSampler`` unless it already is
one, and reads ``sampler`` / ``batch_sampler`` to decide what a loader does. In stoker's
order mode the loader's ``sampler`` is an :class:`OrderSampler`: a ``DistributedSampler``
whose samples are this rank's share of stoker's order for the current epoch (which is what
a DistributedSampler is), and whose ``set_epoch`` selects the loader's epoch. Iterating them
computes the order; the loader itself never goes through them.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Iterator

from torch.utils.data import BatchSampler, DistributedSampler

from stoker.loader.errors import LoaderError
from stoker.loader.order.mixture_order import source_order
from stoker.loader.order.schedule import rank_batch_ids

if TYPE_CHECKING:
    from stoker.loader.dataloader import DataLoader

__all__ = ["OrderBatchSampler", "OrderSampler"]


class _OfLoader:
    """Reads everything from the loader it describes (held weakly: the loader owns it)."""

    def __init__(self, loader: DataLoader) -> None:
        self._ref = weakref.ref(loader)

    @property
    def _loader(self) -> DataLoader:
        loader = self._ref()
        if loader is None:
            raise LoaderError("this sampler describes a stoker DataLoader that no longer "
                              "exists; keep the loader alive while its sampler is in use.")
        return loader

    def _batches(self) -> Iterator[list[int]]:
        loader = self._loader
        plan, epoch = loader._configured(), loader.epoch
        order = source_order(loader._source, loader.seed, epoch, loader.order_options)
        for step in range(plan.steps_per_epoch):
            yield rank_batch_ids(order, plan, step).tolist()


class OrderSampler(_OfLoader, DistributedSampler):
    """This rank's sample ids, in stoker's order, for the loader's current epoch."""

    def __init__(self, loader: DataLoader) -> None:  # DistributedSampler's needs a dataset
        _OfLoader.__init__(self, loader)

    dataset = property(lambda self: self._loader.dataset)
    num_replicas = property(lambda self: self._loader.world_size)
    rank = property(lambda self: self._loader.rank)
    epoch = property(lambda self: self._loader.epoch)
    shuffle = property(lambda self: self._loader.order_options.shuffle)
    seed = property(lambda self: self._loader.seed)
    drop_last = property(lambda self: self._loader.drop_last)

    @property
    def num_samples(self) -> int:
        plan = self._loader._configured()
        return plan.samples_before(plan.steps_per_epoch)

    @property
    def total_size(self) -> int:
        return self._loader._configured().num_samples

    def __iter__(self) -> Iterator[int]:
        for batch in self._batches():
            yield from batch

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Select the loader's epoch (what Lightning and Accelerate call each epoch)."""
        self._loader.set_epoch(epoch)

    def __repr__(self) -> str:
        return f"OrderSampler(rank={self.rank}, num_replicas={self.num_replicas})"


class OrderBatchSampler(_OfLoader, BatchSampler):
    """This rank's batches of sample ids, in stoker's order, for the current epoch."""

    def __init__(self, loader: DataLoader, sampler: OrderSampler) -> None:
        _OfLoader.__init__(self, loader)
        self.sampler: Any = sampler

    batch_size = property(lambda self: self._loader.batch_size)
    drop_last = property(lambda self: self._loader.drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        return self._batches()

    def __len__(self) -> int:
        return self._loader._configured().steps_per_epoch
