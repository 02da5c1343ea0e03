"""Where user code runs: thread and process worker pools, worker info, failures carried
across processes, and the seeds of user code's random state."""

__all__: list[str] = []
