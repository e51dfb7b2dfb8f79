# modalscope: the dashboard under gunicorn by default; the ingest worker with
#   docker run IMAGE modalscope ingest otlp
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MODALSCOPE_BIND=0.0.0.0 \
    MODALSCOPE_DATABASE_URL=sqlite:////data/modalscope.db

# Chromium draws the /render/<panel>.png|svg images (kaleido drives it; BROWSER_PATH names
# it), with fonts for the labels. Only the image renderer uses it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends chromium fonts-liberation fonts-dejavu-core \
    && rm -rf /var/lib/apt/lists/*
ENV BROWSER_PATH=/usr/bin/chromium

WORKDIR /src
COPY pyproject.toml README.md alembic.ini ./
COPY modalscope ./modalscope
COPY app ./app
COPY core ./core
COPY ingest ./ingest
COPY models ./models
COPY migrations ./migrations
COPY assets ./assets
RUN pip install . \
    && useradd --system --home /data modalscope \
    && mkdir -p /data && chown modalscope /data

USER modalscope
WORKDIR /data
VOLUME /data
EXPOSE 8050 4317 4318
# modalscope.gunicorn_conf: threaded workers that read request heads off-thread (a client
# trickling its headers holds no thread and is closed after MODALSCOPE_HEAD_TIMEOUT_S) and
# bound bodies in size and time, so the port may face clients directly. Set
# MODALSCOPE_PUBLIC_URL to the address users reach, so shared links never follow a Host header.
CMD ["gunicorn", "-c", "python:modalscope.gunicorn_conf", "modalscope.app:create_app()"]
