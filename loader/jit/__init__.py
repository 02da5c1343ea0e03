"""Numba compilation: the kernel decorator and its cache location, intrinsics, shared
kernels, and the background warm-up of compiled kernels."""

__all__: list[str] = []
