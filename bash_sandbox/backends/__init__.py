"""Confinement backends, one module each, behind the `SandboxBackend` seam in `base.py`."""
