"""What the side-by-side benchmark drivers share: the command line, finding
the built programs, launching one side under ddprun (or mpirun, for ddp's
MPI backend), reading its result lines, the machine's load, and printing a
Markdown table.

Each benchmark program prints one result line per measurement,
`<name> key=value key=value ...`; a driver runs ddp's side and PyTorch's
side in turn and compares those fields.
"""

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys


def add_common_arguments(parser, programs, rounds_help):
    """The arguments of every driver: the build directory holding ddprun and
    `programs` (paths under it), --rounds and --python."""
    parser.add_argument("build_dir", nargs="?", default="build",
                        help="build directory holding ddprun and %s (default: build)"
                        % " and ".join(programs))
    parser.add_argument("--rounds", type=int, default=2, help=rounds_help)
    parser.add_argument("--python", default=default_python(),
                        help="interpreter with torch, for PyTorch's side (default: current "
                        "PyTorch, the torch 2.11 venv that scripts/compat.sh keeps in "
                        "$DDP_CACHE_DIR, when it exists, else /usr/bin/python3: now %s)"
                        % default_python())
    parser.add_argument("--mpirun", default="mpirun",
                        help="the MPI launcher for ddp's MPI side (default: mpirun on PATH)")
    parser.add_argument("--no-mpi", action="store_true",
                        help="leave out ddp's MPI side (a build without DDP_WITH_MPI)")


def default_python():
    """Current PyTorch's interpreter: the venv with torch 2.11 that
    scripts/compat.sh creates (and CI keeps), when it exists; otherwise
    Debian's /usr/bin/python3 (PyTorch 1.13)."""
    cache = os.environ.get("DDP_CACHE_DIR") or os.path.expanduser("~/.cache/ddp")
    venv_python = os.path.join(cache, "torch-2.11.0", "bin", "python")
    return venv_python if os.access(venv_python, os.X_OK) else "/usr/bin/python3"


def torch_version(python):
    """`python`'s torch version, e.g. "2.11.0" (without the +local part), or
    None when it cannot import torch."""
    proc = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          universal_newlines=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    return proc.stdout.strip().split("+")[0]


def check_rounds(parser, args):
    if args.rounds < 1:
        parser.error("--rounds must be >= 1 (got %d)" % args.rounds)


def built_programs(driver, build_dir, programs):
    """Paths of ddprun and of `programs` in `build_dir`; exits 2, saying what
    to build, when one is missing."""
    paths = [os.path.join(build_dir, "ddprun")] + [os.path.join(build_dir, p) for p in programs]
    for path in paths:
        if not os.access(path, os.X_OK):
            targets = " ".join(["ddprun"] + [os.path.basename(p) for p in programs])
            sys.stderr.write("%s: %s not found or not executable; build it with `ninja -C %s %s` "
                             "(or pass the build directory as the first argument)\n"
                             % (driver, path, build_dir, targets))
            sys.exit(2)
    return paths


def launch(ddprun, world_size):
    """The ddprun prefix that starts `world_size` ranks with plain output."""
    return [ddprun, "--nproc-per-node", str(world_size), "--no-prefix"]


def mpi_launch(driver, mpirun, world_size):
    """The mpirun prefix that starts `world_size` ranks; the program must be
    run with DDP_BACKEND=mpi in its environment (see mpi_env). Exits 2 when
    there is no such launcher. Open MPI's mpirun binds each rank to a core by
    default for 2 ranks; that is kept, as a user's `mpirun -np 2` gets it."""
    path = shutil.which(mpirun)
    if path is None:
        sys.stderr.write("%s: %s not found; install Open MPI (apt-get install openmpi-bin) or "
                         "pass --mpirun PATH, or --no-mpi to leave the MPI side out\n"
                         % (driver, mpirun))
        sys.exit(2)
    command = [path, "-np", str(world_size)]
    version = subprocess.run([path, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True).stdout
    if "Open MPI" in version and os.geteuid() == 0:
        command.append("--allow-run-as-root")
    return command


def mpi_env(env):
    """`env` with ddp's MPI backend chosen (DDP_BACKEND=mpi)."""
    env = dict(env)
    env["DDP_BACKEND"] = "mpi"
    return env


def run_side(driver, side, command, env, line_pattern):
    """Runs one side once; returns the fields of each line matching
    `line_pattern` (whose group 1 is the key=value part). Exits 1, showing
    the side's output, when it prints no such line. A side that printed its
    figures and then failed (PyTorch 2.11's Gloo group can abort at
    interpreter exit, after the work is done) keeps its figures: the failure
    is reported on stdout and in each result's "exit" field."""
    proc = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
    pattern = re.compile(line_pattern)
    results = []
    for line in proc.stdout.splitlines():
        match = pattern.match(line)
        if match:
            results.append(dict(item.split("=", 1) for item in match.group(1).split()))
    if proc.returncode != 0 and results:
        last_error = next((line for line in reversed(proc.stderr.splitlines()) if line.strip()), "")
        print("# note: the %s side exited with code %d after printing its figures (kept): %s"
              % (side, proc.returncode, last_error.strip()[:200]), flush=True)
        for result in results:
            result["exit"] = str(proc.returncode)
        return results
    if proc.returncode != 0 or not results:
        sys.stderr.write("%s: the %s side failed (exit code %d): %s\n"
                         "--- its stdout ---\n%s--- its stderr ---\n%s"
                         % (driver, side, proc.returncode, shlex.join(command), proc.stdout,
                            proc.stderr))
        sys.exit(1)
    return results


def load_average():
    """The 1-minute load average, or NaN where /proc has none."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def warn_if_busy(load_before):
    if load_before > 0.5:
        print("WARNING: the machine was busy before the benchmark started (load average "
              "%.2f); the figures are noisy, rerun on an idle machine." % load_before)


def print_table(header, rows):
    """A Markdown table: the first column left-aligned, the others right."""
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
