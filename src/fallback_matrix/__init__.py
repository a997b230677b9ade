"""CI tooling of torch-fallback: the matrix model, runners, summaries and the CLI.

matrix.yaml (at the repository root) is the one source of truth for cells; see
``python -m fallback_matrix --help``.
"""

from .cells import Cell, expand_cells, pick_cells
from .loader import LoadedMatrix, find_matrix_file, load_matrix

__all__ = ["Cell", "LoadedMatrix", "expand_cells", "find_matrix_file", "load_matrix", "pick_cells"]
