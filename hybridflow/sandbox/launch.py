"""The first program inside the sandbox: set the rlimits, then become the program to run.

Runs under the sandbox's own Python with ``-I -S`` and imports only the standard library (the
project is not visible inside). Usage::

    python3 -I -S launch.py CPU_SECONDS MEMORY_BYTES MAX_PROCESSES MAX_OPEN_FILES MAX_FILE_BYTES -- ARGV...

The CPU limit's hard value is one second above its soft one, so SIGXCPU comes first and SIGKILL
follows if the program ignores it.
"""

import os
import resource
import sys


def main(argv: list[str]) -> None:
    """Set the limits named in ``argv`` and exec the command after ``--``."""
    split = argv.index("--")
    cpu, memory, processes, files, file_bytes = (int(value) for value in argv[:split])
    command = argv[split + 1 :]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
