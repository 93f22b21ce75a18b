# The orchestrator image: the wakeloop package, its dependencies, and the
# sources of the sandbox and proxy images (so it can build them and tell when
# the local ones are stale). `docker compose up` runs it three ways: a one-shot
# sandbox-image build, the sandbox broker, and `wakeloop serve /agents`.
#
# Behind a TLS-intercepting proxy, pip must trust that proxy's CA. compose
# hands the host's CA bundle to pip as a BuildKit secret (`ca_bundle`, default
# /etc/ssl/certs/ca-certificates.crt; set WAKELOOP_CA_BUNDLE for another file).
# A secret is mounted for one RUN and never lands in a layer, and the final
# stage copies only the installed tree, so the published image keeps Debian's
# own CA list. Without compose:
#   DOCKER_BUILDKIT=1 docker build --secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt -t wakeloop .
#
# Offline: FROM names the public base; where no registry is reachable,
# scripts/base-image.sh builds the same tag locally (DESIGN.md §9).
FROM debian:bookworm-slim AS build

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin

# Installed editable from /opt/wakeloop/src, which the final stage keeps: the
# package then finds sandbox-image/ and proxy-image/ beside itself, as in a checkout.
COPY pyproject.toml README.md /opt/wakeloop/src/
COPY orchestrator /opt/wakeloop/src/orchestrator
RUN --mount=type=secret,id=ca_bundle,required=false \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && python3 -m venv /opt/wakeloop/venv \
 && /opt/wakeloop/venv/bin/pip install --no-cache-dir --disable-pip-version-check -e /opt/wakeloop/src \
 && find /opt/wakeloop -name __pycache__ -prune -exec rm -rf {} +

FROM debian:bookworm-slim

# python3 for the venv copied below; setpriv (util-linux, always present) drops root.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin

COPY --from=build /opt/wakeloop /opt/wakeloop
COPY sandbox-image /opt/wakeloop/src/sandbox-image
COPY proxy-image /opt/wakeloop/src/proxy-image
COPY scripts/docker-entrypoint.sh /usr/local/bin/wakeloop-entrypoint
RUN chmod 755 /usr/local/bin/wakeloop-entrypoint

ENV PATH=/opt/wakeloop/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LANG=C.UTF-8
WORKDIR /agents
ENTRYPOINT ["wakeloop-entrypoint"]
CMD ["wakeloop", "serve", "/agents"]
