"""vLLM's own KV events, as live capture and replay both record them: the wire format, the
hash-conflict check, and appending batches to a run file."""
