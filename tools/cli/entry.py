"""The ``stoker`` command line: one entry point, one module per subcommand.

Each subcommand module (``stoker.tools.cli.<name>``) exposes ``add_parser(subparsers)`` and
``run(args) -> int`` and keeps heavy imports inside ``run``, so ``stoker --help`` stays fast.
Exit codes: 0 success, 1 failure (a check failed, data is bad), 2 bad usage.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from stoker.manifest import StokerError, stoker_version

__all__ = ["UsageError", "main"]

_COMMANDS: tuple[str, ...] = (
    "shard",
    "verify",
    "inspect",
    "demo",
    "audit",
    "index",
    "export",
    "serve",
)


class UsageError(StokerError):
    """The user asked for something the command cannot do as asked (exit code 2)."""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stoker", description="Deterministic sharded datasets and a reproducible loader.")
    parser.add_argument("--version", action="version", version=f"stoker {stoker_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        module = importlib.import_module(f"stoker.tools.cli.{name}")
        module.add_parser(sub).set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting, so tests can call it."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage and 0 on --help/--version
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._run(args))
    except UsageError as exc:
        print(f"stoker {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except StokerError as exc:
        print(f"stoker {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"stoker {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `stoker ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
