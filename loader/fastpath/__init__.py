"""The fast path: column plans, gather kernels and their NumPy twins, row-major records,
image decoding and the buffer rings batches are written into."""

__all__: list[str] = []
