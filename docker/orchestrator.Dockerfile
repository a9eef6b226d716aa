# llmfleet orchestrator image: slim, non-root, one console entry point (`llmfleet orchestrator`).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY apps ./apps
COPY stacks ./stacks
RUN pip install --no-cache-dir --prefix=/install -c constraints.txt .
FROM python:3.11-slim
RUN groupadd --system --gid 10001 llmfleet \
 && useradd --system --uid 10001 --gid llmfleet --no-create-home --shell /usr/sbin/nologin llmfleet
COPY --from=build /install /usr/local
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
ENTRYPOINT ["llmfleet"]
CMD ["orchestrator"]
