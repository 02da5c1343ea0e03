"""The part of the DataLoader that depends on rank and world size, resolved late.

Rank and world size are resolved when iteration starts (and by ``len()``,
``state_dict()`` before that), see ``stoker.loader.distributed``; the batch plan and the
staging of this rank's partitions follow. A stoker dataset's order options are fixed at
construction (``stoker.loader.read.order_plan``: they never depend on the world size, so a state
resumes at any world size dividing the partitions).
"""

from __future__ import annotations

from typing import Any

from stoker.loader.distributed import resolve_world
from stoker.loader.options import LoaderOptions
from stoker.loader.order.epoch import OrderOptions
from stoker.loader.order.schedule import BatchPlan

__all__ = ["WorldPlan"]


class WorldPlan:
    """Mixin of :class:`~stoker.loader.dataloader.DataLoader`: rank, world size, plan."""

    _world_arg: tuple[int | None, int | None]
    _world: tuple[int, int] | None
    _options: LoaderOptions
    _order_plan: Any
    _source: Any
    _mode: str
    _loaded: Any
    _plan: BatchPlan
    order_options: OrderOptions
    batch_size: int | None
    drop_last: bool

    @property
    def rank(self) -> int:
        """This process's rank, as resolved now (see ``stoker.loader.distributed``)."""
        return self._world_now()[0]

    @property
    def world_size(self) -> int:
        return self._world_now()[1]

    def _world_now(self) -> tuple[int, int]:
        if self._source is None:  # still constructing the source
            return resolve_world(*self._world_arg)
        self._configured()
        return self._world  # type: ignore[return-value]

    def _configured(self) -> BatchPlan:
        """The batch plan for the world as resolved now (reconfigured when it changed)."""
        world = resolve_world(*self._world_arg)
        if world != self._world:
            self._configure(world)
        return self._plan

    def _configure(self, world: tuple[int, int]) -> None:
        """Order options and batch plan for ``world``; with a sampler the sampler decides
        what each rank reads, so the plan is that of one process."""
        shuffle, order = self._options.shuffle, self._options.order
        rank, size = world if self._mode == "order" else (0, 1)
        if self._order_plan is not None:  # a stoker dataset: options fixed at construction
            options = self._order_plan.options
        else:
            partitions = order.partitions  # None: the smallest multiple of world_size >= default
            if partitions is None:
                partitions = -(-OrderOptions().partitions // size) * size
            options = OrderOptions(shuffle=shuffle, partitions=partitions,
                                   block_size=order.block_size,
                                   partition_mode=order.partition_mode
                                   ).resolve(self._source.shard_rows)
        if shuffle and self._mode == "order" and options.partitions % size:
            fit = [w for w in range(1, options.partitions + 1) if options.partitions % w == 0]
            raise ValueError(f"world_size={size} must divide partitions={options.partitions}; "
                             f"the world sizes that do are {fit}. Pass "
                             "ShuffleOptions(partitions=...) a multiple of every world size you "
                             "plan to resume with (e.g. 720).")
        self.order_options = options
        if self._mode == "order" and hasattr(self._source, "stage"):
            self._source.stage(options, rank, size)
        self._plan = BatchPlan(int(self._source.shard_rows.sum()), (self.batch_size or 1) * size,
                               size, rank, self.drop_last)
        self._world = world
        if self._loaded is not None:  # loaded before the process group existed
            self._loaded.check_compatible(self._state())
