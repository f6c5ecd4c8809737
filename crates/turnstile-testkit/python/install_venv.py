"""Makes a Python venv a test runs a real server from (llama.cpp's, an MCP
server on the official package).

Usage: install_venv.py VENV_DIR REQUIREMENTS_FILE

Installs the pinned packages of REQUIREMENTS_FILE (one `name==version` per
line; `#` starts a comment) into VENV_DIR once: a venv that already holds
them is left alone. An exclusive lock on VENV_DIR.lock serialises
concurrent callers (test binaries and .ci/run started at the same time), so
two never build the same venv at once. Everything comes from PyPI at install
time; nothing is downloaded while the tests run.
"""

import fcntl
import os
import subprocess
import sys
import venv


def requirements(path):
    with open(path, encoding="utf-8") as f:
        lines = (line.split("#", 1)[0].strip() for line in f)
        return [line for line in lines if line]


def installed(venv_dir, packages):
    pip = os.path.join(venv_dir, "bin", "pip")
    if not os.path.exists(pip):
        return False
    frozen = subprocess.run([pip, "freeze"], capture_output=True, text=True)
    if frozen.returncode != 0:
        return False
    lines = {line.lower() for line in frozen.stdout.splitlines()}
    return all(package.lower() in lines for package in packages)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: install_venv.py VENV_DIR REQUIREMENTS_FILE")
    venv_dir = os.path.abspath(sys.argv[1])
    packages = requirements(sys.argv[2])
    os.makedirs(os.path.dirname(venv_dir), exist_ok=True)
    with open(venv_dir + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed(venv_dir, packages):
            return
        venv.create(venv_dir, with_pip=True, clear=True)
        pip = os.path.join(venv_dir, "bin", "pip")
        subprocess.run([pip, "install", "--quiet", *packages], check=True)


if __name__ == "__main__":
    main()
