"""The one compiled part: the write watch's fast path (`bash_sandbox/linux/fast_writes.py`).

Optional: where it cannot be built (no C compiler, not Linux) the package installs without
it, and the Python supervisor answers every trapped call, as it does anyway for the rest.
The source's hash is compiled in, so a build older than its source is never loaded.
"""

import hashlib
import sys
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "bash_sandbox/linux/native/fast_writes.c"

ext_modules = []
if sys.platform.startswith("linux"):
    digest = hashlib.sha256((Path(__file__).parent / SOURCE).read_bytes()).hexdigest()
    ext_modules.append(
        Extension(
            "bash_sandbox.linux._fast_writes",
            sources=[SOURCE],
            define_macros=[("BSF_SOURCE_SHA256", f'"{digest}"')],
            extra_compile_args=["-O2"],
            optional=True,
        )
    )

setup(ext_modules=ext_modules)
