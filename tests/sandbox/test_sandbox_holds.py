"""The sandbox holds against hostile programs: each ends within its limit, with a named outcome, and
nothing it started survives. Real bwrap, real rlimits, real seccomp; the hostile runs go concurrently."""

from __future__ import annotations

import errno
import json
import os
import time
import uuid
from pathlib import Path

import pytest

from hybridflow.sandbox import Outcome, Sandbox, SandboxLimits, SandboxResult, SandboxUnavailableError
from hybridflow.sandbox.runner import _PASSWD

LIMITS = SandboxLimits(
    cpu_seconds=2, wall_seconds=8.0, memory_bytes=256 * 2**20, max_processes=16, max_output_bytes=64 * 2**10
)
SLACK = 5.0  # seconds past the wall limit for start-up and teardown on a loaded 2-core machine (3.5 seen)
SECRET = "HYBRIDFLOW_TEST_SECRET"
MARK = f"hostile-{uuid.uuid4().hex}"  # in every hostile program's argv, to find survivors on the host
SLEEP_SECONDS = "3600.4242"  # the daemonised sleep's argument, to find it on the host

HOSTILE = {
    "infinite_loop": "while True:\n    pass\n",
    "fork_bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"),
    "memory_bomb": "hoard = []\nwhile True:\n    hoard.append(bytearray(10**7))\n",
    "gigabyte_print": "import sys\nchunk = 'x' * 2**20\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n",
    "network": (
        "import json, socket, time\n"
        "report = {}\n"
        "for host in ('127.0.0.1', '192.0.2.1'):\n"
        "    start = time.monotonic()\n"
        "    try:\n"
        "        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
        "        sock.settimeout(5)\n"
        "        sock.connect((host, 80))\n"
        "        report[host] = ['connected', time.monotonic() - start]\n"
        "    except OSError as error:\n"
        "        report[host] = [error.errno, time.monotonic() - start]\n"
        "report['interfaces'] = [line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]]\n"
        "print(json.dumps(report))\n"
    ),
    "read_host_files": (
        "import json, os\n"
        "print(json.dumps({\n"
        "    'passwd': open('/etc/passwd').read(),\n"
        "    'shadow': os.path.exists('/etc/shadow'),\n"
        "    'project': os.path.exists('/work/main/README.md') or os.path.exists('/work'),\n"
        "    'home': os.path.exists('/root'),\n"
        "    'home_listing': os.listdir(os.path.expanduser('~')),\n"
        "    'root_listing': sorted(os.listdir('/')),\n"
        "}))\n"
    ),
    "write_outside": (
        "import json\n"
        "written = []\n"
        "for path in ('/usr/hostile', '/etc/hostile', '/hostile', '/proc/hostile', '/bin/hostile', '/dev/hostile', '/dev/shm/hostile', '/tmp/inside'):\n"
        "    try:\n"
        "        with open(path, 'w') as handle:\n"
        "            handle.write('x')\n"
        "        written.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(json.dumps(written))\n"
    ),
    "environment": "import json, os\nprint(json.dumps(dict(os.environ)))\n",
    "background_process": (
        "import subprocess\n"
        f"subprocess.Popen(['/usr/bin/sleep', '{SLEEP_SECONDS}'], start_new_session=True,\n"
        "                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print('spawned')\n"
    ),
    "seccomp": (
        "import ctypes, errno, json, socket\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "report = {}\n"
        "report['unshare'] = libc.unshare(0x10000000) == -1 and ctypes.get_errno()\n"
        "report['ptrace'] = libc.ptrace(0, 0, None, None) == -1 and ctypes.get_errno()\n"
        "try:\n"
        "    socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "    report['inet_socket'] = 0\n"
        "except OSError as error:\n"
        "    report['inet_socket'] = error.errno\n"
        "socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()\n"
        "print(json.dumps(report))\n"
    ),
}


def _host_processes_with(text: str) -> list[int]:
    """Pids of host processes whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def sandbox():
    box = Sandbox(LIMITS, max_workers=len(HOSTILE))
    yield box
    box.close()


@pytest.fixture(scope="module")
def hostile(sandbox) -> dict[str, SandboxResult]:
    """Every hostile program run once, all at the same time, with a secret in this process's environment."""
    os.environ[SECRET] = "do-not-leak"
    try:
        futures = {
            name: sandbox.submit(["/usr/bin/python3", "-I", "/tmp/prog.py", MARK], files={"prog.py": code})
            for name, code in HOSTILE.items()
        }
        return {name: future.result() for name, future in futures.items()}
    finally:
        del os.environ[SECRET]


def _ended_in_time(result: SandboxResult) -> None:
    assert result.seconds <= LIMITS.wall_seconds + SLACK, result


def test_nothing_survives_any_hostile_run(hostile):
    assert _host_processes_with(MARK) == []
    assert _host_processes_with(SLEEP_SECONDS) == []


def test_infinite_loop_is_stopped(hostile):
    result = hostile["infinite_loop"]
    assert result.outcome in (Outcome.CPU_LIMIT, Outcome.TIMEOUT), result
    _ended_in_time(result)


def test_fork_bomb_is_contained(hostile):
    result = hostile["fork_bomb"]
    # The process limit refuses forks past 16; the survivors spin until the CPU or wall limit.
    assert result.outcome in (Outcome.CPU_LIMIT, Outcome.TIMEOUT), result
    _ended_in_time(result)


def test_memory_bomb_hits_the_memory_limit(hostile):
    result = hostile["memory_bomb"]
    assert result.outcome is Outcome.MEMORY_LIMIT, result
    assert result.stderr.rstrip().endswith("MemoryError")
    _ended_in_time(result)


def test_gigabyte_print_is_cut_at_the_output_cap(hostile):
    result = hostile["gigabyte_print"]
    assert result.outcome is Outcome.OUTPUT_LIMIT, result.outcome
    assert len(result.stdout) + len(result.stderr) == LIMITS.max_output_bytes
    assert set(result.stdout) == {"x"}
    _ended_in_time(result)


def test_no_network(hostile):
    result = hostile["network"]
    assert result.outcome is Outcome.OK, result
    report = json.loads(result.stdout)
    for host in ("127.0.0.1", "192.0.2.1"):
        error, seconds = report[host]
        assert error != "connected"
        assert error == errno.EACCES, report  # the filter refuses the AF_INET socket itself
        assert seconds < 1.0, report  # refused at once, not after a connect timeout
    assert report["interfaces"] == ["lo"]


def test_host_files_are_invisible(hostile):
    result = hostile["read_host_files"]
    assert result.outcome is Outcome.OK, result
    report = json.loads(result.stdout)
    assert report["passwd"] == _PASSWD
    assert report["passwd"] != Path("/etc/passwd").read_text()
    assert report["shadow"] is False
    assert report["project"] is False
    assert report["home"] is False
    assert report["home_listing"] == ["prog.py"]  # home is the run's own directory
    assert report["root_listing"] == ["bin", "dev", "etc", "lib", "lib64", "proc", "sbin", "tmp", "usr"]


def test_only_the_private_directory_is_writable(hostile):
    result = hostile["write_outside"]
    assert result.outcome is Outcome.OK, result
    assert json.loads(result.stdout) == ["/tmp/inside"]
    assert not Path("/usr/hostile").exists()


def test_parent_environment_is_not_inherited(hostile):
    result = hostile["environment"]
    assert result.outcome is Outcome.OK, result
    environment = json.loads(result.stdout)
    assert SECRET not in environment
    assert set(environment) <= {"PATH", "HOME", "LANG", "PWD", "LC_CTYPE"}


def test_background_process_does_not_survive(hostile):
    result = hostile["background_process"]
    assert result.outcome is Outcome.OK, result
    assert result.stdout == "spawned\n"
    assert _host_processes_with(SLEEP_SECONDS) == []


def test_seccomp_filter_is_installed(hostile):
    result = hostile["seccomp"]
    assert result.outcome is Outcome.OK, result
    # Without the filter the sandbox's AF_INET socket would open (its namespace has a loopback device).
    assert json.loads(result.stdout) == {"unshare": 1, "ptrace": 1, "inet_socket": 13}


def test_cpu_limit_is_an_rlimit(sandbox):
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=60.0)
    start = time.monotonic()
    result = sandbox.run("while True:\n    pass\n", limits=limits)
    assert result.outcome is Outcome.CPU_LIMIT, result
    assert time.monotonic() - start < limits.wall_seconds


def test_results_and_errors_are_reported(sandbox):
    ok = sandbox.run("import sys\nprint(sys.stdin.read().upper())\n", stdin="abc")
    assert (ok.outcome, ok.stdout, ok.exit_code) == (Outcome.OK, "ABC\n", 0)
    failed = sandbox.run("raise SystemExit(3)\n")
    assert (failed.outcome, failed.exit_code) == (Outcome.ERROR, 3)
    killed = sandbox.run("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    assert (killed.outcome, killed.exit_code) == (Outcome.KILLED, -15)


def test_missing_bwrap_stops_with_a_named_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailableError, match="bwrap is not installed"):
        Sandbox()


def test_files_outside_the_run_directory_are_refused(sandbox):
    with pytest.raises(ValueError, match="outside the run's directory"):
        sandbox.run("print(1)\n", files={"../escape.py": "x"})


def test_private_directory_is_bounded_and_inputs_are_read_only(sandbox):
    limits = SandboxLimits(max_tmp_bytes=2 * 2**20)
    code = (
        "import errno\n"
        "print(open('data/in.txt').read())\n"
        "try:\n"
        "    open('data/in.txt', 'w')\n"
        "except OSError as error:\n"
        "    print(errno.errorcode[error.errno])\n"
        "open('small', 'wb').write(b'x' * 2**20)\n"
        "try:\n"
        "    open('large', 'wb').write(b'x' * 2**21)\n"
        "except OSError as error:\n"
        "    print(errno.errorcode[error.errno])\n"
    )
    result = sandbox.run(code, files={"data/in.txt": "given"}, limits=limits)
    assert (result.outcome, result.stdout) == (Outcome.OK, "given\nEROFS\nENOSPC\n"), result
