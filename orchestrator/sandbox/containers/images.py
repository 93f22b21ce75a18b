"""The sandbox image: build it, and tell when the local one is stale.

The image is tagged twice: `wakeloop-sandbox:latest`, which policies name,
and `wakeloop-sandbox:inputs-<hash>`, where the hash covers every file under
sandbox-image/. The same hash is stored as an image label, so a running
orchestrator can compare the image it is about to use with the source it
was installed from and say which command rebuilds it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import docker

from orchestrator.assets import asset_dir

SANDBOX_REPO = "wakeloop-sandbox"
INPUTS_LABEL = "wakeloop.inputs"


def sandbox_image_dir() -> Path | None:
    """sandbox-image/ as shipped (assets.py: a checkout, the orchestrator image or the wheel's data)."""
    env = os.environ.get("WAKELOOP_SANDBOX_IMAGE_DIR")
    candidate = Path(env) if env else asset_dir("sandbox-image")
    return candidate if candidate and (candidate / "Dockerfile").is_file() else None


def inputs_hash(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def stale_reason(client: docker.DockerClient, image: str) -> str | None:
    """Why `image` does not match sandbox-image/ here, or None when it does or cannot tell."""
    directory = sandbox_image_dir()
    if directory is None or not image.startswith(SANDBOX_REPO + ":"):
        return None
    want = inputs_hash(directory)
    have = (client.images.get(image).labels or {}).get(INPUTS_LABEL)
    if have == want:
        return None
    return f"image {image} was built from other inputs ({have or 'unknown'}, now {want})"


def build_sandbox_image(client: docker.DockerClient, echo=print) -> str:
    """Build sandbox-image/ as :latest and :inputs-<hash>; stream progress through echo."""
    directory = sandbox_image_dir()
    if directory is None:
        raise FileNotFoundError("sandbox-image/Dockerfile not found; set WAKELOOP_SANDBOX_IMAGE_DIR")
    digest = inputs_hash(directory)
    tag = f"{SANDBOX_REPO}:inputs-{digest}"
    stream = client.api.build(
        path=str(directory), tag=tag, rm=True, forcerm=True, labels={INPUTS_LABEL: digest}, decode=True
    )
    for chunk in stream:
        if "error" in chunk:
            raise RuntimeError(chunk["error"].strip())
        line = chunk.get("stream", "").rstrip()
        if line.startswith("Step "):
            echo(f"  {line}")
    client.images.get(tag).tag(SANDBOX_REPO, "latest")
    return tag
