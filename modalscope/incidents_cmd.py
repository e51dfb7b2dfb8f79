"""`modalscope incidents [--since 1h | --range 1h] [--json]`: findings grouped into incidents
(``app/incidents.py``), most severe first.

The catalog (and pandas) is imported when the command runs, not to build the parser.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime

from .command_kit import catalog_window, open_reading_store
from .core.findings import Incident, StageSuspect, Suspect


def add_incidents_parser(sub) -> None:
    """Register `modalscope incidents` on the CLI's subparsers."""
    p = sub.add_parser("incidents", help="findings grouped into incidents, each under its likely cause "
                                         "(most severe first)")
    p.add_argument("--since", default=None, help="how far back to look: 15m, 1h, 2h, 24h, 7d (default 1h)")
    p.add_argument("--range", default=None, help="the same as --since")
    p.add_argument("--json", action="store_true", help="print the incidents as /api/v1/incidents does")
    p.set_defaults(func=cmd_incidents)


def human_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms >= 1000:
        return f"{ms / 1000:.1f} s"
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def human_span(start: str, end: str) -> str:
    """``14:05–14:32 (27 min)``, with the date when it is not the end's."""
    s = datetime.fromisoformat(start.replace("Z", "+00:00"))
    e = datetime.fromisoformat(end.replace("Z", "+00:00"))
    minutes = (e - s).total_seconds() / 60
    length = f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"
    day = f"{s:%Y-%m-%d} " if s.date() != e.date() else ""
    return f"{day}{s:%H:%M}–{e:%H:%M} ({length})"


def _suspect(s: Suspect) -> str:
    if isinstance(s, StageSuspect):
        return f"{s.stage} {s.added_share * 100:.0f}% of added time"
    return f"{s.key}={s.value} ×{s.lift:,.1f}"


def format_incidents(incidents: list[Incident]) -> str:
    """A table: severity, span, headline kind and subject, its headline number in units,
    folded findings, cause or suspects."""
    from .app.units import evidence_measure

    rows = [("SEVERITY", "WHEN (UTC)", "HEADLINE", "MEASURE", "FINDINGS", "CAUSE / SUSPECTS")]
    for inc in incidents:
        h = inc.headline
        if inc.cause_known:
            lead = f"cause: {h.kind}"
        elif inc.suspects:
            lead = "suspects: " + "; ".join(_suspect(s) for s in inc.suspects[:3])
        else:
            lead = "cause unknown"
        rows.append((inc.severity, human_span(inc.start, inc.end), f"{h.kind} {h.subject.text()}",
                     evidence_measure(h.evidence) or "-", str(len(inc.findings)), lead))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def cmd_incidents(args) -> int:
    window, settings, thresholds = catalog_window(args)
    from .app import incidents as inc
    from .app.findings import find
    from .models.reader import StoreReader

    engine = open_reading_store(settings)
    try:
        reader = StoreReader(engine)
        found = inc.incidents(reader, window, lambda w: find(reader, w, th=thresholds))
    finally:
        engine.dispose()
    if args.json:
        json.dump([i.to_json() for i in found], sys.stdout, indent=2, ensure_ascii=True)
        print()
        return 0
    if not found:
        print(f"no incidents in the last {args.range or args.since or '1h'}")
        return 0
    print(format_incidents(found))
    folded = sum(len(i.findings) for i in found)
    counts = {s: sum(i.severity == s for i in found) for s in ("critical", "warning", "info")}
    print(f"{len(found)} incidents ({counts['critical']} critical, {counts['warning']} warning, "
          f"{counts['info']} info) from {folded} findings")
    return 0
