"""One module per `kvscope` subcommand, each with `register(commands)`."""
