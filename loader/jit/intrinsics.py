"""LLVM intrinsics the record kernels need and Numba does not expose.

- :func:`pointer` (:func:`pointer32`, :func:`pointer64`): an integer address as a ``uint8*``
  (``uint32*``, ``uint64*``), so one kernel call can read the row-major records of many
  shards (each its own allocation), or many columns, through a table of addresses.
- :func:`prefetch`: ``llvm.prefetch`` (read, keep in all cache levels). A shuffled batch reads
  rows at random addresses; issuing the loads of rows a few iterations ahead keeps many cache
  misses in flight instead of the handful the out-of-order core finds on its own (measured:
  0.16 -> 0.09 ms per W1 batch of 1024 rows, bench/RESULTS.md "Loader").

Both are plain machine operations; the callers own the safety argument (the addresses are of
live arrays, see :class:`stoker.loader.fastpath.record_table.RecordTable`).
"""

from __future__ import annotations

from typing import Any

from stoker.loader.jit.kernel import lazy_intrinsic

__all__ = ["pointer", "pointer32", "pointer64", "prefetch"]


def _pointer_to(address: Any, value: str) -> Any:
    """The signature and code of an intrinsic that reads integer ``address`` as a pointer to
    values of the Numba type named ``value``."""
    from numba import types

    if not isinstance(address, types.Integer):
        return None
    result = types.CPointer(getattr(types, value))

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(result))

    return result(address), codegen


@lazy_intrinsic
def pointer(typingctx: Any, address: Any) -> Any:
    """``uint8*`` at integer ``address`` (index it like an array of bytes)."""
    return _pointer_to(address, "uint8")


@lazy_intrinsic
def pointer32(typingctx: Any, address: Any) -> Any:
    """``uint32*`` at integer ``address`` (index it like an array of 4-byte words)."""
    return _pointer_to(address, "uint32")


@lazy_intrinsic
def pointer64(typingctx: Any, address: Any) -> Any:
    """``uint64*`` at integer ``address`` (index it like an array of 8-byte words)."""
    return _pointer_to(address, "uint64")


@lazy_intrinsic
def prefetch(typingctx: Any, address: Any) -> Any:
    """Hint the CPU to load the cache line holding integer ``address`` (never faults)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils

    if not isinstance(address, types.Integer):
        return None
    byte_ptr, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fnty = ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        ptr = builder.inttoptr(args[0], byte_ptr)
        # (address, read=0, locality=3: keep in every level, data cache=1)
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.none(address), codegen
