# The controller's image, the one charts/muster runs. Multi-stage: the first stage builds
# Muster's wheel (Alembic migrations included) and the wheels of its dependencies; the
# second installs them into a slim Python with nothing else, and runs as a non-root user.
# No Docker engine runs in CI: tests/unit/test_chart_image.py checks the wheel and a fresh
# install of it, not this file's build (see docs/deploy.md).
ARG PYTHON=3.12

FROM python:${PYTHON}-slim AS build
WORKDIR /src
COPY pyproject.toml README.md alembic.ini ./
COPY quota/ quota/
COPY controllers/ controllers/
COPY migrations/ migrations/
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:${PYTHON}-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels muster \
    && rm -rf /wheels
# The chart runs as 65532 with a read-only root filesystem: the spool, the SQLite file and
# /tmp are volumes it mounts.
USER 65532:65532
EXPOSE 8080 9443
ENTRYPOINT ["muster"]
CMD ["controller"]
