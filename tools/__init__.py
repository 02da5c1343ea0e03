"""stoker.tools: the ``stoker`` CLI (``stoker.tools.cli.main``) and reports."""

__all__: list[str] = []
