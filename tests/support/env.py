"""The suite's places and child processes: the repository's root, this venv's executables, the
environment for child jobs, and the stacks of Python processes for a test that hangs."""
import os
import shutil
import sys

#: the repository's root (this file is tests/support/env.py)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BIN = os.path.dirname(sys.executable)


def subprocess_env(**extra: str) -> dict:
    """The environment for child jobs: this venv first on PATH, quiet TensorFlow."""
    env = dict(os.environ)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def dump_python_stacks() -> str:
    """The stacks of every other Python process on the machine (``py-spy dump``), for a test that
    timed out: they say which process (a kernel, a launcher, a rank) waits, and on what."""
    import subprocess

    spy = shutil.which("py-spy", path=BIN)
    if not spy:
        return "(py-spy is not installed: no stacks)"
    dumps = []
    for pid in sorted(int(name) for name in os.listdir("/proc") if name.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if pid != os.getpid() and "python" in command:
            proc = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
            dumps.append(f"== pid {pid}: {command[:300]}\n{proc.stdout}{proc.stderr}")
    return "\n".join(dumps)
