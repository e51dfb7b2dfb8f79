"""A small, fast run of bench/load_bench.py: 200 API requests from 4 clients against
`modalscope serve` while `modalscope ingest otlp` takes a generator's traces. No timing is
asserted (the numbers live in docs/benchmarks.md); what must hold under load is no 5xx, no
failed request and every acknowledged span stored."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.faults.helpers import clean_env

BENCH = Path(__file__).resolve().parents[2] / "bench" / "load_bench.py"


def test_api_under_load_while_ingesting_answers_everything_and_loses_no_span(db_url):
    r = subprocess.run([sys.executable, str(BENCH), "--requests", "200", "--concurrency", "4", "--server", "serve",
                        "--seed-traces", "150", "--ingest-rate", "1000", "--database-url", db_url, "--json"],
                       env=clean_env(), capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["requests"] == 200
    assert result["errors_5xx"] == 0 and result["errors"] == 0, result["per_endpoint"]
    assert all(set(row["statuses"]) == {"200"} for row in result["per_endpoint"].values())  # JSON keys
    assert len(result["per_endpoint"]) == 10  # every endpoint of the mix was asked
    assert result["ingested_spans_acked"] > 0 and not result["generator_errors"]
    assert result["all_ingested_spans_landed"], (result["spans_stored"], result["spans_expected"])
    assert result["spans_stored"] == 150 * 7 + result["ingested_spans_acked"]
