"""Cleanup, the command ``clean``: what interrupted runs leave (labelled containers, partial
wheelhouse fills) and, with --caches, the caches themselves (the build images, the cache volume
or directory, the wheelhouses)."""

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from . import runners
from .cache import cache_root
from .errors import EXIT_OK

if TYPE_CHECKING:  # cli imports this module for its command table
    from .cli import Context


def cmd_clean(c: "Context") -> int:
    cache = cache_root()
    for partial in sorted(cache.glob("wheelhouse/.*.partial")):
        shutil.rmtree(partial, ignore_errors=True)
        c.reporter.say(f"removed interrupted wheelhouse fill {partial}")
    if runners.docker_problem() is None:
        client = runners.connect_docker()
        for container in client.containers.list(all=True, filters={"label": runners.LABEL}):
            container.remove(force=True)
            c.reporter.say(f"removed leftover container {container.name}")
        if c.args.caches:
            for volume in client.volumes.list(filters={"name": runners.CACHE_VOLUME}):
                volume.remove(force=True)
                c.reporter.say(f"removed volume {volume.name}")
            for image in client.images.list(filters={"label": f"{runners.LABEL}=image"}):
                client.images.remove(str(image.id), force=True)
                c.reporter.say(f"removed image {', '.join(image.tags) or image.short_id}")
    run_dir = Path(os.environ.get(runners.DOCKER_CACHE_ENV, ""))  # absolute: a host directory
    for directory in (cache, run_dir) if c.args.caches else ():
        if directory.is_absolute() and directory.exists():
            shutil.rmtree(directory, ignore_errors=True)
            c.reporter.say(f"removed {directory}")
    return EXIT_OK
