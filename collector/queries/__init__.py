"""Every read query over a run file, one module per subject. The SQL text lives here; the
connection it runs on belongs to `collector.store.run_file.RunFile`."""
