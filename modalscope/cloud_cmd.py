"""`modalscope ingest cloud-trace` and `modalscope export-metrics` (issue 6: being written)."""


def add_cloud_parsers(sub, ingest_sub) -> None:
    """Register `export-metrics` on ``sub`` and `cloud-trace` on ``ingest_sub``."""
