"""stoker.sharder."""

__all__: list[str] = []
