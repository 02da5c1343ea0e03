"""The sharder's input readers: tabular files (``readers``) and the other sources.

``dispatch`` picks a source by format and plugs it into the plan; ``webdataset`` (with
``tar_layout``, the byte spans of an uncompressed tar), ``images``, ``hf`` and ``tokens``
each read one kind of input.
"""

from stoker.sharder.sources.dispatch import (SOURCE_FORMATS, discover, hash_source,
                                             manifest_classes, read_source, scan_source,
                                             source_options)

__all__ = ["SOURCE_FORMATS", "discover", "hash_source", "manifest_classes", "read_source",
           "scan_source", "source_options"]
