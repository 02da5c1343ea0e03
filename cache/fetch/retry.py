"""How often and how patiently a download is retried: capped, exponential, jittered."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry rules for one shard download.

    Attributes:
        max_retries: retries after the first request (0 = no retry). Each failed request
            (reset, stall, truncation, 5xx, 429) counts; 401/403/404/410 are never retried.
        backoff_base: seconds before the first retry; doubles on every further retry.
        backoff_max: upper bound on one backoff delay, in seconds.
        jitter: share of each delay drawn at random (0 = fixed delays, 1 = "full jitter"),
            so that many ranks retrying together do not hammer the server in lock-step.
        max_retry_after: upper bound in seconds on a server's ``Retry-After``; a longer value
            is honoured only up to this cap.
        timeout: seconds a connection may stay silent before the request counts as stalled.
    """

    max_retries: int = 5
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    jitter: float = 0.5
    max_retry_after: float = 120.0
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"RetryPolicy.max_retries must be an int >= 0, got {self.max_retries!r}.")
        for name in ("backoff_base", "backoff_max", "max_retry_after", "timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"RetryPolicy.{name} must be a number of seconds >= 0, got {value!r}.")
        if self.timeout == 0:
            raise ValueError("RetryPolicy.timeout must be > 0 seconds, got 0.")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"RetryPolicy.jitter must lie in [0, 1], got {self.jitter!r}.")

    def delay(self, retry: int, retry_after: float | None = None,
              rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based).

        The exponential delay ``backoff_base * 2**(retry-1)`` (capped at ``backoff_max``) loses a
        random share ``jitter`` of itself; a server's ``Retry-After`` (capped at
        ``max_retry_after``) is a lower bound, because the server knows better than we do.
        """
        base = min(self.backoff_max, self.backoff_base * (2.0 ** max(0, retry - 1)))
        draw = (rng or random).random()
        delay = base * (1.0 - self.jitter * draw)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_retry_after))
        return delay
