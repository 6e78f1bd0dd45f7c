"""The compiled parts (`bash_sandbox/linux/native/`): the write watch's fast path
(`fast_writes.py`), the spawn helper's child (`compiled_child.py`) and the Landlock
backend's PID 1 (`sandbox_init.py`, an executable); and the `bash-sandbox` command itself,
the warm CLI's native client (`bash_sandbox/warm/native/client.c`).

Optional: where they cannot be built (no C compiler, not Linux) the package installs without
them, and the Python paths serve instead (the supervisor answers every trapped call, the
helper forks in Python, a bash is PID 1, `bash-sandbox` is a script that runs the Python
entry). Each library's and the init's source hash is compiled in, so a build older than its
source is never used (`native_build.py`, `sandbox_init.py`); the command is rebuilt with
every install.
"""

import hashlib
import sys
from distutils.ccompiler import new_compiler
from distutils.command.build_scripts import build_scripts
from distutils.sysconfig import customize_compiler
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
NATIVE = {
    "bash_sandbox.linux._fast_writes": ("bash_sandbox/linux/native/fast_writes.c", "BSF"),
    "bash_sandbox.linux._spawn_child": ("bash_sandbox/linux/native/spawn_child.c", "BSC"),
}
INIT_SOURCE = "bash_sandbox/linux/native/sandbox_init.c"
INIT_NAME = "_sandbox_init"


def digest(source: str) -> str:
    return hashlib.sha256((HERE / source).read_bytes()).hexdigest()


class BuildWithInit(build_ext):
    """The extensions, then the init executable beside them (in place for `pip install -e`)."""

    def run(self) -> None:
        super().run()
        if not sys.platform.startswith("linux"):
            return
        out_dir = Path(self.get_ext_fullpath("bash_sandbox.linux._spawn_child")).parent
        try:
            objects = self.compiler.compile(
                [INIT_SOURCE],
                output_dir=self.build_temp,
                macros=[("BSI_SOURCE_SHA256", f'"{digest(INIT_SOURCE)}"')],
                extra_postargs=["-O2", "-ffreestanding", "-fno-stack-protector"],
            )
            # No libc: its start-up would cost more than the init's work (the source says).
            self.compiler.link_executable(
                objects, INIT_NAME, output_dir=str(out_dir), extra_postargs=["-nostdlib", "-static"]
            )
        except Exception as exc:
            print(f"warning: {INIT_NAME} not built ({exc}): a bash is PID 1 instead")


CLIENT_SOURCE = "bash_sandbox/warm/native/client.c"
# Installed as `bash-sandbox`; replaced by the compiled client wherever that builds.
COMMAND_SCRIPT = "bash_sandbox/warm/native/bash-sandbox"


class BuildNativeCommand(build_scripts):
    """The scripts, then the native client over the Python `bash-sandbox` script."""

    def run(self) -> None:
        super().run()
        if not sys.platform.startswith("linux"):
            return
        out = Path(self.build_dir) / Path(COMMAND_SCRIPT).name
        temp = Path(self.build_dir) / "native-client"
        try:
            compiler = new_compiler()
            customize_compiler(compiler)
            objects = compiler.compile(
                [CLIENT_SOURCE], output_dir=str(temp), extra_postargs=["-O2"]
            )
            compiler.link_executable(objects, "client", output_dir=str(temp))
            (temp / "client").replace(out)
        except Exception as exc:
            print(f"warning: the native client not built ({exc}): bash-sandbox is the script")


ext_modules = []
if sys.platform.startswith("linux"):
    for name, (source, prefix) in NATIVE.items():
        ext_modules.append(
            Extension(
                name,
                sources=[source],
                define_macros=[(f"{prefix}_SOURCE_SHA256", f'"{digest(source)}"')],
                extra_compile_args=["-O2"],
                optional=True,
            )
        )

setup(
    ext_modules=ext_modules,
    scripts=[COMMAND_SCRIPT],
    cmdclass={"build_ext": BuildWithInit, "build_scripts": BuildNativeCommand},
)
