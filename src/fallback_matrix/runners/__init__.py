"""Runners execute one cell's job: `local` on the host, `docker` in the cell's image."""
