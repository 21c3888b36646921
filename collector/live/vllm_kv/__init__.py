"""vLLM's own KV events: the wire format, the subscriber, conflicts and ingest."""
