"""fallback_matrix: the CI tooling of torch-fallback (``python -m fallback_matrix --help``).

matrix.yaml, at the repository root, is the one source of truth. One name per concept:

matrix      the validated matrix.yaml (``matrix.LoadedMatrix``; its schema ``matrix.MatrixFile``)
cell        one entry of the matrix, defaults applied (``matrix.Cell``): a torch variant (cpu or
            cuda) and version on one Python, built and tested in one image
wheelhouse  every wheel a cell installs, downloaded once on the host (``wheelhouse``)
job         what a runner runs for one cell (``job.Job``, passed as JSON; in a container, on its
            bare Python with the wheelhouse's packaging): timed steps, environment to example
runner      where a job runs (``runners``): docker (the cell's image), local (a host Python),
            auto (docker when a daemon answers)
reporter    progress and subprocess lines on the terminal and in the cell's log (``report``)
result      ``artifacts/<cell>/``: the wheel, junit.xml, auditwheel.txt, cell.log, result.json
summary     the table of results, a row per cell and per example (``summary``)
example     the third-party backend every job builds and tests against the wheel
gpu test    a ``gpu: true`` cell: the wheel of the build cell with the same torch, on a GPU
cross test  the wheel of a cpu cell on the CUDA build of the same torch release, and the reverse
            (``workflows.cross_tests``)
Python row  a cell's one abi3 wheel on another Python of its ``also_pythons``, the same torch
            (``workflows.python_tests``)
cache       the wheelhouses and the cells' cached environments, each kept under a size cap,
            least recently used pruned first, never an entry in use (``cache``)
workflow    a GitHub workflow generated from the matrix (``workflows``, from workflows.yaml)
error       a failure told to the user as-is, its class saying which and its exit code (``errors``)
"""
