"""`modalscope anomalies` (issue 5: being written)."""


def add_anomalies_parser(sub) -> None:
    """Register `modalscope anomalies` on the CLI's subparsers."""
