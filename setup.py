"""The compiled parts (`bash_sandbox/linux/native/`): the write watch's fast path
(`fast_writes.py`) and the spawn helper's child (`compiled_child.py`).

Optional: where they cannot be built (no C compiler, not Linux) the package installs without
them, and the Python paths serve instead (the supervisor answers every trapped call, the
helper forks in Python). Each source's hash is compiled in, so a build older than its source
is never loaded (`native_build.py`).
"""

import hashlib
import sys
from pathlib import Path

from setuptools import Extension, setup

NATIVE = {
    "bash_sandbox.linux._fast_writes": ("bash_sandbox/linux/native/fast_writes.c", "BSF"),
    "bash_sandbox.linux._spawn_child": ("bash_sandbox/linux/native/spawn_child.c", "BSC"),
}

ext_modules = []
if sys.platform.startswith("linux"):
    for name, (source, prefix) in NATIVE.items():
        digest = hashlib.sha256((Path(__file__).parent / source).read_bytes()).hexdigest()
        ext_modules.append(
            Extension(
                name,
                sources=[source],
                define_macros=[(f"{prefix}_SOURCE_SHA256", f'"{digest}"')],
                extra_compile_args=["-O2"],
                optional=True,
            )
        )

setup(ext_modules=ext_modules)
