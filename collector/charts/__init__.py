"""The charts the CI report and the app both draw, below both: kvscope's look (`theme`) and the
run-versus-run charts (`comparison`); pure functions from query results to Plotly figures."""
