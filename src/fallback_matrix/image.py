"""The build image of a cell: its Dockerfile, build args and a content-derived tag.

The tag hashes every file of the build context and the build args, so an
unchanged image is found by tag and never rebuilt, and any change gets a new tag.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .cells import Cell
from .errors import ImageBuildError

IMAGE_REPOSITORY = "torch-fallback-build"
BASE_IMAGE_ARG = "BASE_IMAGE"


@dataclass(frozen=True)
class ImagePlan:
    context: Path
    dockerfile: str
    build_args: Mapping[str, str]
    tag: str


def context_digest(context: Path, build_args: Mapping[str, str]) -> str:
    """sha256 over the context's files (names and bytes) and the build args."""
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(path.relative_to(context).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    digest.update(json.dumps(dict(sorted(build_args.items()))).encode())
    return digest.hexdigest()


def image_tag(
    context: Path, build_args: Mapping[str, str], repository: str = IMAGE_REPOSITORY
) -> str:
    return f"{repository}:{context_digest(context, build_args)[:12]}"


def plan_image(repo_root: Path, cell: Cell) -> ImagePlan:
    """The image a cell runs in: the Dockerfile's directory is the build context."""
    dockerfile = repo_root / cell.image.dockerfile
    if not dockerfile.is_file():
        raise ImageBuildError(
            f"cell {cell.name}: Dockerfile {dockerfile} not found (matrix.yaml image.dockerfile)"
        )
    build_args = {BASE_IMAGE_ARG: cell.image.base}
    context = dockerfile.parent
    return ImagePlan(
        context=context,
        dockerfile=dockerfile.name,
        build_args=build_args,
        tag=image_tag(context, build_args),
    )
