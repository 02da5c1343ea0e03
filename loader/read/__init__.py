"""Sources: the readers that turn sample ids into batches (Arrow shards, indexed Parquet,
torch datasets, remote manifests, mixtures) and the plans and staging behind them."""

__all__: list[str] = []
