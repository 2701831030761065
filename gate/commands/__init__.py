"""One module per subcommand: `register(subparsers)` declares its arguments, `main(args)`
turns them into one call of a library function and returns the exit code."""
