"""Chart builders: pure functions from query results to Plotly figures, a module per page
(`comparison` also draws the CI report's charts), all in the look of `theme`."""
