"""One module per CLI command, each exposing `main(args) -> int`."""
