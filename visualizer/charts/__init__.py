"""Chart builders: pure functions from query results to Plotly figures, a module per page, all
in the look of `collector.charts.theme` (the run-versus-run charts the CI report draws too are
`collector.charts.comparison`)."""
