"""The run's health at a glance: a short scorecard, each line green, amber, red or grey (not
applicable) with one sentence of why and the app page that shows it (scorecard.py), judged
against thresholds a user may edit (thresholds.py, thresholds.toml; docs/health.md)."""
