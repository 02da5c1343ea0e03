"""The run ledger: what a run consumed, in which order, and the digests of the bytes
delivered (writer, format, reader, restart checks)."""

__all__: list[str] = []
