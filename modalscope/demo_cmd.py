"""`modalscope demo` (being written: see issue 3)."""


def add_demo_parser(sub) -> None:
    """Register the `demo` subcommand on the CLI's subparsers."""
