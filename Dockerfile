# The curator service, both roles. Configure with DATABASE_URL and CURATOR_ADMIN_KEY (see README).
#   API (default):  python -m service         (migrates, then serves; HEALTHCHECK below)
#   worker:         python -m service.worker  (runs release jobs; override the healthcheck)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CURATOR_HOST=0.0.0.0 \
    CURATOR_PORT=8000 \
    CURATOR_ENVIRONMENT=production

WORKDIR /app
RUN useradd --create-home --uid 10001 curator

COPY pyproject.toml README.md alembic.ini ./
COPY service ./service
RUN pip install --no-cache-dir -e . \
    && mkdir -p /app/data && chown curator /app/data

USER curator
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s \
  CMD python -c "import os,urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('CURATOR_PORT', '8000')).status != 200)"
# Migrates the database (alembic upgrade head), then serves. Workers: see docker-compose.yml.
CMD ["python", "-m", "service"]
