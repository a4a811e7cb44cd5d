"""The job queue: what a job is (``spec``), what the queue records about it (``records``), where it
is stored (``store``), the in-process queue and its worker thread (``queue``, ``worker_thread``),
and the queue-side speed-ups (``coalesce``, ``overlap``)."""
