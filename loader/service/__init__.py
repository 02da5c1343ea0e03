"""The data-service client side: batch keys, the wire format, routing with failover and
hedging, and the service-mode source and worker pool."""

__all__: list[str] = []
