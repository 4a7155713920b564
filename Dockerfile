# syntax=docker/dockerfile:1
# One image for every cronman command: `cronman api` (default), `cronman scheduler`,
# `cronman migrate`, `cronman maintain`.
#
#   docker build -t cronman .
#   docker run --rm -p 8080:8080 -e CRONMAN_DATABASE_URL=... -e CRONMAN_REDIS_URL=... cronman
#   docker run --rm -p 9090:9090 -e CRONMAN_DATABASE_URL=... -e CRONMAN_REDIS_URL=... cronman scheduler

ARG PYTHON_IMAGE=python:3.11-slim

# ---- build: install the project and its dependencies into a virtual environment ----
FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# A compiler and libpq headers for any dependency that has no wheel for this platform.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential libpq-dev \
    && rm -rf /var/lib/apt/lists/*

# The runtime stage copies this directory to the same path, so the scripts' shebangs stay valid.
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --upgrade pip setuptools wheel

# Only what the package is built from (tests/deploy/test_packaging.py builds a wheel from the same list).
WORKDIR /src
COPY pyproject.toml setup.cfg README.md ./
COPY cronman/ cronman/
COPY api/ api/
COPY scheduler_node/ scheduler_node/
RUN pip install . \
    && cronman --help >/dev/null

# ---- runtime ----
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="cronman" \
      org.opencontainers.image.description="REST cron-management service: API, scheduler nodes, migrations and maintenance"

# libpq for PostgreSQL drivers built against it; a fixed non-root user matching the chart's runAsUser.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libpq5 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 cronman \
    && useradd --system --uid 10001 --gid cronman --home-dir /app --no-create-home \
       --shell /usr/sbin/nologin cronman

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CRONMAN_MIGRATIONS_DIR=/app/alembic

COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY alembic/ /app/alembic/

# Smoke check, away from any source tree: the installed package finds its Lua scripts and the migrations,
# and carries none of the development servers (the `devservers` extra).
RUN cronman --help >/dev/null \
    && python -c "from cronman.redis.keys import lua; from cronman.store.migrate import migrations_dir; lua('members'); print(migrations_dir())" \
    && python -c "from cronman.dev.embedded import DEV_SERVER_PACKAGES, missing_dev_servers; assert len(missing_dev_servers()) == len(DEV_SERVER_PACKAGES)"

# Numeric, so Kubernetes can verify runAsNonRoot.
USER 10001:10001

# 8080: API (CRONMAN_API_PORT); 9090: scheduler node health and metrics (CRONMAN_NODE_PORT).
EXPOSE 8080 9090

ENTRYPOINT ["cronman"]
CMD ["api"]
