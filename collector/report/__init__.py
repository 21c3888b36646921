"""`kvscope report`: a candidate run against a baseline, as Markdown, HTML, JUnit and JSON.

thresholds (the limits, from TOML) -> figures (read from each run file) -> checks ->
comparison -> markdown / html (charts) / junit -> outputs (the files).
"""
