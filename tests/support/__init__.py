"""What several test modules share: paths, tiny runs, engines, browsers, servers."""
