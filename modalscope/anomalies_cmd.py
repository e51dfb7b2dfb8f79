"""`modalscope anomalies [--since 1h | --range 1h] [--json]`: the anomaly catalog's findings, most
severe first.

The catalog (and pandas) is imported when the command runs, not to build the parser.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from .command_kit import catalog_window, open_reading_store

if TYPE_CHECKING:
    from .core.findings import Finding


def add_anomalies_parser(sub) -> None:
    """Register `modalscope anomalies` on the CLI's subparsers."""
    p = sub.add_parser(
        "anomalies", help="named anomaly findings in the last --since (most severe first)",
        description="Run the anomaly catalog's detectors over the store (MODALSCOPE_DATABASE_URL) for the "
                    "last --since (or --range, as the API calls it) and print each finding: severity, kind, "
                    "subject, window, evidence, hint and exemplar traces, most severe first.")
    p.add_argument("--since", default=None, help="how far back to look: 15m, 1h, 2h, 24h, 7d (default 1h)")
    p.add_argument("--range", default=None, help="the same as --since (the API's name for it)")
    p.add_argument("--json", action="store_true", help="print the findings as /api/v1/anomalies does")
    p.set_defaults(func=cmd_anomalies)


def format_finding(f: Finding) -> str:
    subject = ", ".join(f"{k}={v['key']}={v['value']}" if isinstance(v, dict) else f"{k}={v}"
                        for k, v in f.subject.to_json().items())
    from .app.units import evidence_items

    # (in units, as the Anomalies page shows them; --json keeps the raw numbers)
    evidence = ", ".join(f"{label} {value}" for _, label, value in evidence_items(f.evidence))
    lines = [f"{f.severity.upper():8} {f.kind:22} {subject}",
             f"         {f.start} → {f.end}",
             f"         evidence: {evidence}",
             f"         hint: {f.hint}"]
    if f.exemplar_trace_ids:
        lines.append(f"         exemplars: {' '.join(f.exemplar_trace_ids)}")
    return "\n".join(lines)


def cmd_anomalies(args) -> int:
    window, settings, thresholds = catalog_window(args)
    from .app.findings import find
    from .models.reader import StoreReader

    engine = open_reading_store(settings)
    try:
        found = find(StoreReader(engine), window, th=thresholds)
    finally:
        engine.dispose()
    if args.json:
        json.dump([f.to_json() for f in found], sys.stdout, indent=2, ensure_ascii=True)
        print()
        return 0
    if not found:
        print(f"no findings in the last {args.range or args.since or '1h'}")
        return 0
    for f in found:
        print(format_finding(f))
    counts = {s: sum(f.severity == s for f in found) for s in ("critical", "warning", "info")}
    print(f"{len(found)} findings: {counts['critical']} critical, {counts['warning']} warning, {counts['info']} info")
    return 0
