#!/usr/bin/env bash
# Provide the python:X.Y-slim-bookworm base images that matrix.yaml names, on a
# host that can reach no image registry (GitHub's runners pull the official ones).
#
#   bash docker/local-python-images.sh            # every Python of matrix.yaml (images, also_pythons)
#   bash docker/local-python-images.sh 3.10 3.13  # these versions
#
# An image already present (or pullable) is left alone. Otherwise it is built
# from debian:bookworm-slim (../shared/ci/docker-up.sh provides that one) and a
# CPython X.Y built on this bookworm host by pyenv (PYENV_ROOT, default
# ~/.pyenv): the host's interpreter links the same Debian libraries the image
# installs. Without such an interpreter it says which one is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYENV_ROOT=${PYENV_ROOT:-$HOME/.pyenv}

versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then
  # the base images matrix.yaml names, and the Pythons of its cells' also_pythons rows
  mapfile -t versions < <(
    { grep -oE 'python:3\.[0-9]+-slim-bookworm' matrix.yaml | sed -E 's/python:(3\.[0-9]+)-.*/\1/'
      grep -E '^\s*also_pythons:' matrix.yaml | grep -oE '3\.[0-9]+'; } | sort -u)
fi

for version in "${versions[@]}"; do
  tag="python:${version}-slim-bookworm"
  if docker image inspect "$tag" >/dev/null 2>&1; then echo "[local-python] have $tag"; continue; fi
  if timeout 30 docker pull -q "$tag" >/dev/null 2>&1; then echo "[local-python] pulled $tag"; continue; fi
  if [ "$version" = "3.11" ]; then
    echo "[local-python] $tag is missing: ../shared/ci/docker-up.sh builds it" >&2; exit 1
  fi
  prefix=$(ls -d "$PYENV_ROOT"/versions/"$version".* 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$prefix" ] || [ ! -x "$prefix/bin/python$version" ]; then
    echo "[local-python] cannot make $tag: no registry answers and no CPython $version under" \
         "$PYENV_ROOT/versions (install one: pyenv install $version)" >&2
    exit 1
  fi
  docker image inspect debian:bookworm-slim >/dev/null 2>&1 || {
    echo "[local-python] debian:bookworm-slim is missing: run ../shared/ci/docker-up.sh first" >&2; exit 1; }
  echo "[local-python] building $tag from debian:bookworm-slim and $prefix"
  docker build -q -t "$tag" -f docker/Dockerfile.local-python "$prefix" >/dev/null
  docker run --rm "$tag" python3 --version
done
