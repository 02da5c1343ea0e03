"""The ``stoker`` command line: :func:`main` (``entry``) and one module per subcommand.

``audit``, ``demo``, ``export``, ``index``, ``inspect`` (and ``inspect_mixture``), ``serve``,
``shard`` and ``verify`` each expose ``add_parser(subparsers)`` and ``run(args) -> int``.
"""

from stoker.tools.cli.entry import UsageError, main

__all__ = ["UsageError", "main"]
