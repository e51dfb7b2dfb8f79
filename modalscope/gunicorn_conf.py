"""gunicorn settings for the dashboard: `gunicorn -c python:modalscope.gunicorn_conf 'modalscope.app:create_app()'`.

Workers are stateless (all state is in the database and the URL), so scale them with
WEB_CONCURRENCY or more replicas behind a load balancer.
"""

import os

bind = f"{os.environ.get('MODALSCOPE_BIND', '127.0.0.1')}:{os.environ.get('MODALSCOPE_PORT', '8050')}"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
worker_class = "gthread"
threads = int(os.environ.get("MODALSCOPE_THREADS", "4"))
timeout = 60
graceful_timeout = 30
keepalive = 5
accesslog = "-"
# Each worker builds its own app (and engine) after the fork: no shared connections.
preload_app = False


def on_starting(server):
    """Once, in the master before any worker: create the schema in an empty database."""
    from modalscope.models.schema import ensure_schema
    from modalscope.settings import Settings

    ensure_schema(Settings.from_env().database_url)
