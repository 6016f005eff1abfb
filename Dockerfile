# memstream's worker and API (see docker-compose.yml). Build: docker build -t memstream .
#
# Two stages: the first builds memstream's wheel from this source tree, the second
# installs only that wheel and its dependencies (binary wheels from PyPI: no compiler,
# no source tree, no tests in the image).

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
WORKDIR /src
COPY . .
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    MEMSTREAM_HOME=/var/lib/memstream \
    MEMSTREAM_STORAGE_ROOT=/var/lib/memstream/lance
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --home-dir /var/lib/memstream --shell /usr/sbin/nologin memstream \
    && mkdir -p /var/lib/memstream \
    && chown memstream:memstream /var/lib/memstream
# The directory exists and belongs to the user before VOLUME, so a fresh named volume
# mounted here is writable by it.
VOLUME ["/var/lib/memstream"]
WORKDIR /var/lib/memstream
USER memstream
EXPOSE 8080
ENTRYPOINT ["memstream"]
CMD ["--help"]
