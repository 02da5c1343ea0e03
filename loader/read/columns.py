"""Checks of the column arguments of a source against its dataset's schema.

Every source that reads a stoker dataset (:class:`~stoker.loader.read.arrow.ArrowSource`, the
service's :mod:`stoker.loader.service.source`) takes ``columns``, ``features``,
``categoricals`` and an image column; checking them here, once, gives every source the same
error, naming the argument and the fix, before any shard is opened.
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from stoker.loader.fastpath.images import ImageOptions
from stoker.manifest import Manifest, ManifestError

__all__ = ["check_categoricals", "check_column_names", "check_image_column"]


def check_column_names(manifest: Manifest, columns: Sequence[str] | None,
                       features: Sequence[str] | None,
                       categoricals: Sequence[str] | None) -> None:
    """Raise :class:`ManifestError` naming the argument and the first column the dataset
    does not have."""
    names = manifest.arrow_schema.names
    for what, given in (("columns", columns), ("features", features),
                        ("categoricals", categoricals)):
        unknown = [c for c in (given or ()) if c not in names]
        if unknown:
            raise ManifestError(f"{what}={list(given or ())!r}: no column named "
                                f"{unknown[0]!r} in this dataset; its columns are {names}.")


def check_categoricals(schema: pa.Schema, categoricals: Sequence[str]) -> None:
    """Raise :class:`ValueError` for a categorical column that is neither integer nor
    dictionary (its codes are stacked into an int64 tensor)."""
    for name in categoricals:
        t = schema.field(name).type
        if not (pa.types.is_integer(t) or pa.types.is_dictionary(t)):
            raise ValueError(f"categoricals={list(categoricals)!r}: column {name!r} is {t}; "
                             "categoricals must be integer or dictionary columns (pass "
                             "float columns in features= instead).")


def check_image_column(schema: pa.Schema, image: ImageOptions) -> None:
    """Raise :class:`ManifestError` if ``image.column`` is not in the dataset, ValueError if it
    is not a binary column (of encoded JPEG/PNG images)."""
    if image.column not in schema.names:
        raise ManifestError(f"image column {image.column!r} is not in this dataset; "
                            f"its columns are {schema.names}.")
    t = schema.field(image.column).type
    if not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        raise ValueError(f"ImageOptions.column={image.column!r} is {t}; it must be a "
                         "binary column of encoded JPEG/PNG images.")
