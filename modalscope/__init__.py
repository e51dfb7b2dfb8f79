"""modalscope: a trace explorer for multimodal inference latency.

The package is split as the design card lays it out: ``modalscope.app`` (Dash + Flask),
``modalscope.ingest`` (sources, decoding, tagging, writer), ``modalscope.models``
(SQLAlchemy models and engine) and ``modalscope.migrations`` (Alembic). Importing this
package is cheap on purpose: nothing heavy happens until a command or factory runs.
"""

__version__ = "0.1.0"
