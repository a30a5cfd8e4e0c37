#!/usr/bin/env python3
"""Random faults against a training job that checkpoints and restarts.

Runs mnist_train or gpt_train (or any program with the same flags, the same
`latest` file and the same final line) under
a launcher that restarts the group after a failure (ddprun --max-restarts,
or torchrun's elastic agent), and meanwhile kills a random rank at a random
moment, FAULTS times: SIGKILL, SIGTERM, SIGSTOP then SIGKILL, or SIGKILL
while a checkpoint is being written. Everything random comes from --seed,
which is printed. Then checks that:
  - the job ended by itself, with exit status 0, before --deadline;
  - each fault was followed by a new attempt within --recovery seconds (no
    rank hung on a dead or stopped peer);
  - its final parameters equal those of the same job run without faults,
    bit for bit (the program's "final parameters: checksum X" line), which
    holds only if every resume restored the model, the optimizer and the
    position in the data (mnist_train: the sampler's epoch and position;
    gpt_train: the step) exactly.

  scripts/chaos.py --train build/examples/mnist_train --ddprun build/ddprun \\
      --work /tmp/chaos --seed 1 --faults 30 -- --epochs 4 --train-size 1200

Flags after `--` go to the program, which also gets --checkpoint-dir and
--checkpoint-every, and resumes by itself from the checkpoint that the
directory's `latest` names. Checkpoint files and directories are named
epoch-* (mnist_train) or step-* (gpt_train). --launcher torchrun runs
`--torchrun CMD` (default: torchrun on PATH) with --max-restarts. Prints one line per fault and, last,
"chaos: seed S: N faults, final parameters equal to the uninterrupted
run's (checksum X)" or what went wrong; exits 0 only when every check holds.
Exits 77 when --launcher torchrun cannot run. The program's output is in
WORK/<name>.log. Linux only (reads /proc).
"""

import argparse
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid

CHECKSUM = re.compile(r"final parameters: checksum ([0-9a-f]+)")
TAG_VARIABLE = "DDP_CHAOS_TAG"


def log(text):
    print("chaos: " + text, flush=True)


class Fail(Exception):
    pass


class Skip(Exception):
    """The launcher cannot run here: exit 77, CTest's "skipped"."""


def ranks_of(tag, program):
    """{rank: pid} of the live processes running `program` with our tag."""
    found = {}
    name = os.path.basename(program)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")) != name:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone, or not ours to read
        if state == "Z" or (TAG_VARIABLE + "=" + tag).encode() not in environ:
            continue
        for variable in environ:
            if variable.startswith(b"RANK="):
                found[int(variable[5:])] = pid
    return found


def is_checkpoint(name):
    return name.startswith(("epoch-", "step-"))


def newest_checkpoint(directory):
    """The tag `latest` names ("epoch-2", "epoch-3-step-10", gpt_train's
    "step-40"), or None."""
    try:
        with open(os.path.join(directory, "latest")) as f:
            text = f.read()
    except OSError:
        return None
    named = re.search(r"^checkpoint (\S+)$", text, re.M)
    if named:
        return named.group(1)
    epochs = re.search(r"^completed_epochs (\d+)$", text, re.M)
    steps = re.search(r"^completed_steps (\d+)$", text, re.M)
    if not epochs:
        return None
    e, s = int(epochs.group(1)), int(steps.group(1)) if steps else 0
    return f"epoch-{e}" if s == 0 else f"epoch-{e + 1}-step-{s}"


def save_in_progress(directory, since):
    """A checkpoint file written after `since` (time.time()) that `latest`
    does not name yet: a save under way. (Older ones are what a save killed
    earlier left behind, removed after the next complete save.)"""
    newest = newest_checkpoint(directory)
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    for name in names:
        if is_checkpoint(name) and (newest is None or (name != newest and not name.startswith(newest + "."))):
            try:
                if os.stat(os.path.join(directory, name)).st_mtime >= since:
                    return name
            except OSError:
                continue  # removed meanwhile
    return None


class Job:
    def __init__(self, args, name, checkpoint_dir, restarts):
        self.args = args
        self.tag = uuid.uuid4().hex
        self.log_path = os.path.join(args.work, name + ".log")
        program = [args.train] + args.program_args + [
            "--checkpoint-dir", checkpoint_dir, "--checkpoint-every", str(args.checkpoint_every)]
        if args.launcher == "ddprun":
            launcher = [args.ddprun, "--nproc-per-node", str(args.nproc), "--max-restarts", str(restarts)]
        else:
            launcher = torchrun_command(args.torchrun, args.nproc, restarts)
        env = dict(os.environ, **{TAG_VARIABLE: self.tag})
        self.command = launcher + program
        self.out = open(self.log_path, "w")
        self.process = subprocess.Popen(self.command, stdout=self.out, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        self.started = time.monotonic()
        self.ended = set()  # the pids of the attempts that a fault ended
        self.last_fault = None  # time.monotonic() of the last fault
        self.longest_recovery = 0.0  # from a fault to the next attempt's ranks
        self.newest_at_fault = None  # the newest checkpoint at the last fault

    def running(self):
        return self.process.poll() is None

    def stop(self):
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        self.process.wait()

    def finish(self, deadline):
        try:
            return self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            for pid in ranks_of(self.tag, self.args.train).values():
                os.kill(pid, signal.SIGKILL)
            raise Fail(f"the job ran past its deadline ({self.args.deadline} s) and was killed; "
                       f"its output: {self.log_path}")
        finally:
            self.out.close()

    def first_checkpoint(self, directory):
        """Seconds from the start until `latest` first appears in
        `directory` (the first save complete), or None if the job ended
        first."""
        while self.running():
            if os.path.exists(os.path.join(directory, "latest")):
                return time.monotonic() - self.started
            time.sleep(0.01)
        return None

    def checksum(self):
        with open(self.log_path) as f:
            found = CHECKSUM.findall(f.read())
        if not found:
            raise Fail(f"no 'final parameters: checksum' line in {self.log_path}")
        return found[-1]


def torchrun_command(torchrun, nproc, restarts):
    """torchrun's command line, with dashes in its flags or (PyTorch 1.x)
    underscores; PyTorch 1.x on Python 3.11 also needs parsable --redirects
    and --tee (tests/integration/run_torchrun_test.sh says why)."""
    base = shlex.split(torchrun)
    try:
        help_text = subprocess.run(base + ["--help"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        help_text = ""
    if "--max" not in help_text:
        raise Skip(f"'{torchrun}' cannot run (no PyTorch with torch.distributed.run?)")
    if "--nproc-per-node" in help_text:
        return base + ["--standalone", "--no-python", "--nproc-per-node", str(nproc), "--max-restarts",
                       str(restarts)]
    return base + ["--standalone", "--no_python", "--nproc_per_node", str(nproc), "--max_restarts",
                   str(restarts), "--redirects", "2", "--tee", "2"]


def wait_for_attempt(job, old_pids, nproc, timeout):
    """Waits until `nproc` ranks run that are not among `old_pids`; returns
    {rank: pid}, or None when the job ended first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not job.running():
            return None
        ranks = ranks_of(job.tag, job.args.train)
        if len(ranks) == nproc and not set(ranks.values()) & old_pids:
            if job.last_fault is not None:
                job.longest_recovery = max(job.longest_recovery, time.monotonic() - job.last_fault)
            return ranks
        time.sleep(0.01)
    raise Fail(f"no new attempt with {nproc} ranks within {timeout} s of the last fault "
               f"(a rank hung, or the launcher did not restart); output: {job.log_path}")


def saved_since(directory, since):
    """Whether a checkpoint file was written in `directory` after `since`
    (time.time()): the attempt has trained and saved."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    for name in names:
        try:
            if is_checkpoint(name) and os.stat(os.path.join(directory, name)).st_mtime >= since:
                return True
        except OSError:
            continue
    return False


def inject(job, rng, checkpoint_dir, nproc, number, startup, span):
    """One fault. Returns the pids of the attempt it ended, or None when the
    job ended before it could be injected.

    A quarter of the faults fall in start-up (up to `startup` seconds after
    the attempt's ranks started: loading, rendezvous, resuming); the others
    up to `span` seconds after the attempt's first save (the training
    resumed), so that an attempt trains at most `span` seconds and a few
    steps before its fault, however fast it started."""
    ranks = wait_for_attempt(job, job.ended, nproc, job.args.recovery)
    if ranks is None:
        return None
    attempt_start = time.time()
    kind = rng.choice(["SIGKILL", "SIGTERM", "SIGSTOP, then SIGKILL", "SIGKILL in a save"])
    victim = rng.randrange(nproc)
    in_startup = rng.random() < 0.25
    delay = rng.uniform(0.0, startup if in_startup else span)
    stopped_for = rng.uniform(0.2, 1.5)
    if in_startup:
        when = f"{delay:.2f} s after the attempt's ranks started"
    else:
        while not saved_since(checkpoint_dir, attempt_start):
            if not job.running():
                return None
            time.sleep(0.005)
        when = f"{delay:.2f} s after the attempt's first save"
    time.sleep(delay)
    if kind == "SIGKILL in a save":
        # The first save after the delay; a kill there and then when none
        # is seen within a second.
        end = time.monotonic() + 1.0
        seen = None
        while seen is None and time.monotonic() < end and job.running():
            seen = save_in_progress(checkpoint_dir, attempt_start)
            if seen is None:
                time.sleep(0.0005)
        when = f"while {seen} was being written" if seen else when + " (no save seen within 1 s after)"
    pid = ranks[victim]
    try:
        if kind == "SIGTERM":
            os.kill(pid, signal.SIGTERM)
        elif kind.startswith("SIGSTOP"):
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stopped_for)
            os.kill(pid, signal.SIGKILL)
            when += f", stopped for {stopped_for:.2f} s"
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        when += " (it had already ended)"
    job.last_fault = time.monotonic()
    job.newest_at_fault = newest_checkpoint(checkpoint_dir)
    log(f"fault {number}: {kind} to rank {victim} (pid {pid}) {when}; newest checkpoint {job.newest_at_fault}")
    return set(ranks.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", required=True, help="the training program (mnist_train, gpt_train)")
    parser.add_argument("--launcher", choices=["ddprun", "torchrun"], default="ddprun")
    parser.add_argument("--ddprun", default="ddprun")
    parser.add_argument("--torchrun", default="torchrun", help="the torchrun command (may have words)")
    parser.add_argument("--work", required=True, help="a directory for checkpoints and logs")
    parser.add_argument("--seed", type=int, default=None, help="default: drawn, and printed")
    parser.add_argument("--faults", type=int, default=30)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=3)
    parser.add_argument("--startup", type=float, default=None,
                        help="start-up faults fall up to this many seconds after an attempt's ranks "
                             "start (default: the uninterrupted run's time to its first save)")
    parser.add_argument("--span", type=float, default=None,
                        help="the other faults fall up to this many seconds after an attempt's first "
                             "save (default: the uninterrupted run's training time after its first "
                             "save, divided by twice the number of faults)")
    parser.add_argument("--deadline", type=float, default=1800, help="seconds for each whole run")
    parser.add_argument("--recovery", type=float, default=60,
                        help="seconds from a fault to the next attempt's ranks")
    parser.add_argument("--reference", help="the uninterrupted run's checksum, when known")
    parser.add_argument("program_args", nargs="*")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    os.makedirs(args.work, exist_ok=True)
    rng = random.Random(args.seed)
    log(f"seed {args.seed}; {args.faults} faults; {args.nproc} ranks under {args.launcher}; "
        f"{os.path.basename(args.train)} {' '.join(args.program_args)}")
    try:
        reference = args.reference
        if reference is None:
            directory = os.path.join(args.work, "uninterrupted")
            subprocess.run(["rm", "-rf", directory], check=True)
            job = Job(args, "uninterrupted", directory, 0)
            startup = job.first_checkpoint(directory)
            if job.finish(time.monotonic() + args.deadline) != 0 or startup is None:
                raise Fail(f"the uninterrupted run failed, or saved no checkpoint; output: {job.log_path}")
            reference = job.checksum()
            seconds = time.monotonic() - job.started
            log(f"uninterrupted run: checksum {reference} in {seconds:.1f} s, the first checkpoint after "
                f"{startup:.1f} s")
            # An attempt trains at most `span` before its fault: the faults
            # together take at most half of the training, so the job is
            # still running at the last one.
            if args.startup is None:
                args.startup = startup
            if args.span is None:
                args.span = (seconds - startup) / (2 * args.faults)
        elif args.startup is None or args.span is None:
            raise Fail("--reference needs --startup and --span too")
        log(f"start-up faults up to {args.startup:.2f} s after an attempt's ranks start (--startup), the "
            f"others up to {args.span:.2f} s after its first save (--span)")
        checkpoint_dir = os.path.join(args.work, f"seed-{args.seed}")
        subprocess.run(["rm", "-rf", checkpoint_dir], check=True)
        job = Job(args, f"seed-{args.seed}", checkpoint_dir, args.faults + 2)
        deadline = job.started + args.deadline
        injected = 0
        try:
            while injected < args.faults:
                ended = inject(job, rng, checkpoint_dir, args.nproc, injected + 1, args.startup, args.span)
                if ended is None:
                    break
                job.ended |= ended
                injected += 1
        except Exception:
            job.stop()
            raise
        status = job.finish(deadline)
        seconds = time.monotonic() - job.started
        if status != 0:
            raise Fail(f"the job exited with status {status} after {injected} faults; output: {job.log_path}")
        if injected < args.faults:
            raise Fail(f"the job finished after only {injected} of {args.faults} faults: give it more to "
                       f"train (more epochs or a larger --train-size), or a smaller --span")
        checksum = job.checksum()
        if checksum != reference:
            raise Fail(f"seed {args.seed}: final parameters differ from the uninterrupted run's: checksum "
                       f"{checksum}, expected {reference}; output: {job.log_path}")
        log(f"seed {args.seed}: {injected} faults in {seconds:.1f} s (at most {job.longest_recovery:.1f} s from a "
            f"fault to the next attempt's ranks; the last fault after {job.newest_at_fault}), final parameters equal to the uninterrupted run's (checksum "
            f"{checksum})")
        return 0
    except Fail as e:
        log(f"FAILED: {e}")
        return 1
    except Skip as e:
        log(f"skipped: {e}")
        return 77


if __name__ == "__main__":
    sys.exit(main())
