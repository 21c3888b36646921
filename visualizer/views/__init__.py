"""One module per page, each with a `render()` function."""
