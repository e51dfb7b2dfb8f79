"""gunicorn settings for the dashboard: `gunicorn -c python:modalscope.gunicorn_conf 'modalscope.app:create_app()'`.

Workers are stateless (all state is in the database and the URL), so scale them with
WEB_CONCURRENCY or more replicas behind a load balancer.

The worker class is ``gthread`` reading request heads in its main loop
(``modalscope.gunicorn_worker.HeadFirstWorker``): a client trickling its headers a byte at
a time holds no thread, and is closed after ``MODALSCOPE_HEAD_TIMEOUT_S``. Safe to expose
directly; a buffering proxy in front (nginx, a cloud load balancer) does no harm.
"""

import os

from modalscope.settings import setting_from_env

bind = f"{setting_from_env('bind')}:{setting_from_env('port')}"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))  # gunicorn's own variable
worker_class = "modalscope.gunicorn_worker.HeadFirstWorker"
threads = setting_from_env("threads")
timeout = 60
graceful_timeout = 30
keepalive = 5
# Connections a worker holds open at once (kept-alive and still sending a head included).
worker_connections = 1000
# Request line and header limits (gunicorn's defaults, stated): bigger heads are a 400.
limit_request_line = 8190
limit_request_fields = 100
limit_request_field_size = 8190
accesslog = "-"
# No gunicornc control socket: one fixed path per user clashes between instances, and the
# dashboard needs no run-time control beyond signals.
control_socket_disable = True
# Each worker builds its own app (and engine) after the fork: no shared connections.
preload_app = False


def on_starting(server):
    """Once, in the master before any worker: create the schema in an empty database."""
    from modalscope.models.schema import ensure_schema
    from modalscope.settings import Settings

    ensure_schema(Settings.from_env().database_url)
