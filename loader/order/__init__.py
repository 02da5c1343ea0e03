"""The order contract: pure functions of (dataset fingerprint, seed, epoch) -> sample ids,
for single datasets and mixtures. Torch-free."""

__all__: list[str] = []
