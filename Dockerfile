# The pipeline image: Celery workers and the `sira` CLI (reindex job, import, bench).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY pipeline ./pipeline
COPY mappings ./mappings
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 --user-group sira
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001:10001
WORKDIR /home/sira
ENV SIRA_STATE_DIR=/home/sira/.cache/sira-pipeline PYTHONUNBUFFERED=1
CMD ["sira", "--help"]
