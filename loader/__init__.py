"""stoker.loader."""

__all__: list[str] = []
