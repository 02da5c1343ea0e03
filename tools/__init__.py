"""stoker.tools: the ``stoker`` CLI (:mod:`stoker.tools.cli`), the run audit
(:mod:`stoker.tools.audit`) and the export of datasets (:mod:`stoker.tools.export`)."""

__all__: list[str] = []
