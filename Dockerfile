# The controller's image, the one charts/muster runs. Multi-stage: the first stage installs
# Muster (Alembic migrations included) and its runtime dependencies into a virtualenv and
# takes out what never runs; the second copies that virtualenv alone onto a slim Python, runs
# no pip and holds no wheel, cache or build tool, and runs as a non-root user.
# `docker build -t muster/controller:0.1.0 .` builds it; without a Docker engine,
# `muster local-cluster images` builds it with buildah (docs/deploy.md, "The image").
ARG PYTHON=3.12

FROM python:${PYTHON}-slim AS build
WORKDIR /src
COPY pyproject.toml README.md alembic.ini ./
COPY quota/ quota/
COPY controllers/ controllers/
COPY migrations/ migrations/
# Out of the virtualenv once installed, as Muster never runs them:
# - pip and setuptools (installing is this stage's business);
# - kubernetes.aio, the asyncio twin of the client (68 MB of the client's 125 MB), and
#   aiohttp with the packages only it needs: Muster uses the synchronous client alone.
# The import of every module of Muster then proves nothing it needs went with them.
RUN python -m venv /opt/muster \
    && /opt/muster/bin/pip install --no-cache-dir . \
    && /opt/muster/bin/pip uninstall --yes \
       aiohttp aiohttp-retry aiosignal aiohappyeyeballs attrs frozenlist multidict propcache yarl \
    && rm -rf /opt/muster/lib/python*/site-packages/kubernetes/aio \
    && /opt/muster/bin/python -c "import pkgutil, importlib, controllers, quota, migrations; \
[importlib.import_module(m.name) for p in (controllers, quota) \
 for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')]" \
    && /opt/muster/bin/pip uninstall --yes pip setuptools

FROM python:${PYTHON}-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    PATH=/opt/muster/bin:$PATH
COPY --from=build /opt/muster /opt/muster
# The chart runs as 65532 with a read-only root filesystem: the spool, the SQLite file and
# /tmp are volumes it mounts.
USER 65532:65532
EXPOSE 8080 9443
ENTRYPOINT ["muster"]
CMD ["controller"]
