"""fallback_matrix: the CI tooling of torch-fallback (``python -m fallback_matrix --help``).

matrix.yaml, at the repository root, is the one source of truth. One name per concept:

matrix      the validated matrix.yaml (``loader.LoadedMatrix``; its schema: ``model``)
cell        one entry of the matrix with the defaults applied (``cells.Cell``): a torch
            variant and version on one Python, built and tested in one image
variant     the kind of torch build: ``cpu`` (CPU-only) or ``cuda``
wheelhouse  every wheel a cell installs, downloaded once on the host (``wheelhouse``)
job         what a runner executes for one cell: build, repair and test its wheel, or
            test a given one (``cell_job.Job``, the same JSON on the host and inside)
runner      where a job runs: ``docker`` (the cell's image) or ``local`` (a host venv)
result      ``artifacts/<cell>/``: the wheel, junit.xml, auditwheel.txt, and result.json (the
            job's steps, completed by the host's record); rows of the summary table
example     the third-party backend every job builds and tests against the wheel, a row
            ``<cell>/example`` of its own
gpu test    a ``gpu: true`` cell: the wheel of the build cell with the same torch, on a GPU
cross test  the wheel of a cpu cell on the CUDA build of the same torch release
workflow    a GitHub workflow generated from the matrix (``workflows``)

This module imports nothing: ``fallback_matrix.cell_job`` and ``fallback_matrix.versions``
also run inside a cell, where only the standard library (and, for ``versions``, the
cell's environment) is there.
"""
