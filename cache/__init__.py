"""stoker.cache."""

__all__: list[str] = []
