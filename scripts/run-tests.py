#!/usr/bin/env python3
"""The README's test command's runner (issue 58): every test of the workspace, release profile.

1. Builds every test binary once: ``cargo test --release --workspace --no-run`` (the programs the
   end-to-end tests start come with it).
2. Runs them ``--jobs`` at a time, the longest first (by the last run's times in
   ``target/test-times.json``, else by ``scripts/test-plan.txt``), each from its package's
   directory as cargo runs it, its output kept in ``target/test-logs/``. The plan also splits a
   suite out of a binary, and marks the ones that start during the build (the Patroni suite: it
   waits on timeouts far more than it computes, so it fills the build's idle moments beside the
   others); every test makes its own lab, ports and data directories.
3. Runs the doctests (``cargo test --release --workspace --doc``).
4. Prints where the time went: set-up, build, then every job, longest first.

A failing binary's output is printed in full; the exit status is 1 if anything failed.

Usage: scripts/test.sh [-p CRATE]... [--jobs N] [-- ARGS FOR EACH TEST BINARY]
(``scripts/test.sh -p placement``: one crate's tests; ``-- name_filter``: tests whose name has it.)
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get('CARGO_TARGET_DIR') or os.path.join(ROOT, 'target')
TIMES = os.path.join(TARGET, 'test-times.json')
LOGS = os.path.join(TARGET, 'test-logs')
PLAN = os.path.join(ROOT, 'scripts', 'test-plan.txt')
RESULT = re.compile(r'^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored')


def say(message):
    print('test: %s' % message, flush=True)


def minutes(seconds):
    return '%dm %02ds' % divmod(int(round(seconds)), 60) if seconds >= 60 else '%.1f s' % seconds


class Job(object):
    """One test binary (or the doctests): what runs, where, and what came of it."""

    def __init__(self, name, command, cwd, env=None):
        self.name, self.command, self.cwd, self.env = name, command, cwd, env or {}
        self.seconds = None
        self.status = None
        self.counts = [0, 0, 0]  # passed, failed, ignored
        self.log = os.path.join(LOGS, re.sub(r'[^A-Za-z0-9_.-]+', '_', name) + '.log')

    def run(self, processes):
        began = time.monotonic()
        env = dict(os.environ)
        env.update(self.env)
        with open(self.log, 'w') as out:
            process = subprocess.Popen(self.command, cwd=self.cwd, env=env, stdout=out,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
            processes.add(process)
            self.status = process.wait()
            processes.discard(process)
        self.seconds = time.monotonic() - began
        with open(self.log, errors='replace') as f:
            for line in f:
                match = RESULT.match(line.strip())
                if match:
                    for i in range(3):
                        self.counts[i] += int(match.group(i + 2))


def plan():
    """``scripts/test-plan.txt``: the jobs known to be slow (slowest first), those that run alone,
    those that start as soon as they are built, environment variables of some, and the modules of
    a binary run as jobs of their own."""
    entries = {'slow': [], 'alone': set(), 'early': set(), 'env': {}, 'split': {}}
    with open(PLAN) as f:
        for line in f:
            line = line.split('#')[0].strip()
            if ':' not in line:
                continue
            kind, name = (part.strip() for part in line.split(':', 1))
            if kind == 'slow':
                entries['slow'].append(name)
            elif kind in ('alone', 'early'):
                entries[kind].add(name)
            elif kind == 'split':
                name, _, module = name.rpartition(' ')
                entries['split'].setdefault(name.strip(), []).append(module)
            elif kind == 'env':
                name, _, setting = name.rpartition(' ')
                key, _, value = setting.partition('=')
                entries['env'].setdefault(name.strip(), {})[key] = value
    return entries


def split_job(job, modules):
    """A binary with modules to split: one job for each such module (``BINARY MODULE::``, the
    module as its filter) and one for the rest (``--skip`` each)."""
    if not modules:
        return [job]
    out = [Job('%s %s' % (job.name, module), job.command + [module], job.cwd, dict(job.env))
           for module in modules]
    rest = sum((['--skip', module] for module in modules), [])
    return out + [Job(job.name, job.command + rest, job.cwd, dict(job.env))]


class Runner(object):
    """Runs jobs at most ``parallel`` at a time after the build (longest expected first), the
    ``alone`` ones last; those of the plan's ``early`` list as soon as they are built, beside the
    others (they wait on timeouts far more than they compute)."""

    def __init__(self, parallel, test_args):
        self.plan = plan()
        # With test arguments of the user's no binary is split: libtest's filters are
        # alternatives, and a module's filter would widen the user's.
        if test_args:
            self.plan['split'] = {}
        self.slots = threading.Semaphore(parallel)
        self.lock = threading.Lock()
        self.processes, self.done, self.failed, self.early = set(), [], [], []
        self.total = 0

    def jobs_of(self, job):
        jobs = split_job(job, self.plan['split'].get(job.name))
        for j in jobs:
            j.env.update(self.plan['env'].get(j.name, {}))
        return jobs

    def _run(self, job, slot=True):
        if slot:
            with self.slots:
                job.run(self.processes)
        else:
            job.run(self.processes)
        with self.lock:
            self.done.append(job)
            ok = job.status == 0
            if not ok:
                self.failed.append(job.name)
            say('[%d/%d] %s %-52s %8s  %d passed%s%s' % (
                len(self.done), self.total, 'ok  ' if ok else 'FAIL', job.name, minutes(job.seconds),
                job.counts[0], ', %d failed' % job.counts[1] if job.counts[1] else '',
                ', %d ignored' % job.counts[2] if job.counts[2] else ''))

    def start_early(self, job):
        """Starts ``job`` now if the plan says so (it needs only what its own crate builds)."""
        if job.name not in self.plan['early']:
            return False
        say('%s: built, started during the build' % job.name)
        # It mostly waits: it takes none of the --jobs slots the CPU-bound jobs share.
        thread = threading.Thread(target=self._run, args=(job, False), daemon=True)
        thread.start()
        self.early.append(thread)
        return True

    def run(self, jobs, parallel):
        guess = expected_seconds(jobs, self.plan['slow'])
        queue = sorted((j for j in jobs if j.name not in self.plan['alone']), key=lambda j: -guess[j.name])

        def worker():
            while True:
                with self.lock:
                    if not queue:
                        return
                    job = queue.pop(0)
                self._run(job)
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(parallel)]
        for t in threads:
            t.start()
        for t in threads + self.early:
            while t.is_alive():
                t.join(1.0)
        for job in jobs:
            if job.name in self.plan['alone']:
                self._run(job)

    def kill(self):
        for process in list(self.processes):
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except OSError:
                pass

    def stop(self, signum, frame):
        self.kill()
        sys.exit(130)


def build(packages, test_args, runner):
    """Builds the test binaries; the jobs that run them (those the runner started early aside)."""
    command = ['cargo', 'test', '--release', '--no-run', '--message-format=json-render-diagnostics']
    command += ['-p' + p for p in packages] if packages else ['--workspace']
    say('building: %s' % ' '.join(command))
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    jobs = []
    for line in process.stdout:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get('reason') != 'compiler-artifact' or not message.get('executable'):
            continue
        if not message.get('profile', {}).get('test'):
            continue
        package_dir = os.path.dirname(message['manifest_path'])
        package = os.path.basename(package_dir)
        target = message['target']
        kind = target['kind'][0]
        where = target['name'] if kind == 'test' else kind if kind == 'lib' else '%s %s' % (kind, target['name'])
        job = Job('%s %s' % (package, where), [message['executable']] + test_args, package_dir,
                  {'CARGO_MANIFEST_DIR': package_dir, 'CARGO_PKG_NAME': package,
                   'CARGO': os.environ.get('CARGO', 'cargo')})
        for j in runner.jobs_of(job):
            runner.total += 1
            if not runner.start_early(j):
                jobs.append(j)
    if process.wait() != 0:
        say('the build failed (above)')
        runner.kill()
        sys.exit(1)
    return jobs


def last_times():
    """Each job's time in the last run that ran it (``target/test-times.json``)."""
    try:
        with open(TIMES) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def expected_seconds(jobs, slow):
    """The last run's time of each job; for a job never timed, its place among the slow ones puts
    it before the unknown ones."""
    last = last_times()
    guess = {}
    for job in jobs:
        if job.name in last:
            guess[job.name] = last[job.name]
        elif job.name in slow:
            guess[job.name] = 10000.0 - slow.index(job.name)
        else:
            guess[job.name] = 1.0
    return guess


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('-p', '--package', action='append', default=[],
                        help='only this crate (repeatable); default: the whole workspace')
    parser.add_argument('--jobs', type=int, default=int(os.environ.get('TEST_JOBS', '3')),
                        help='test binaries at a time (default 3, or $TEST_JOBS)')
    parser.add_argument('--setup-seconds', type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument('test_args', nargs='*', help='arguments for every test binary (after --)')
    args = parser.parse_args()
    parallel = max(1, args.jobs)
    os.makedirs(LOGS, exist_ok=True)
    runner = Runner(parallel, args.test_args)
    signal.signal(signal.SIGINT, runner.stop)
    signal.signal(signal.SIGTERM, runner.stop)
    began = time.monotonic()
    jobs = build(args.package, args.test_args, runner)
    built = time.monotonic()
    doc = ['cargo', 'test', '--release', '--doc']
    doc += ['-p' + p for p in args.package] if args.package else ['--workspace']
    jobs.append(Job('doctests', doc + (['--'] + args.test_args if args.test_args else []), ROOT))
    runner.total += 1
    say('running %d jobs (test binaries, suites split out of them, the doctests), %d at a time'
        % (runner.total, parallel))
    runner.run(jobs, parallel)
    finished = time.monotonic()
    done = runner.done

    times = last_times()
    times.update({j.name: round(j.seconds, 1) for j in done})
    with open(TIMES, 'w') as f:
        json.dump(times, f, indent=1, sort_keys=True)

    for job in done:
        if job.status != 0:
            print('\n======== %s failed (exit %s); its output (%s):' % (job.name, job.status, job.log))
            with open(job.log, errors='replace') as f:
                sys.stdout.write(f.read())
    total = [sum(j.counts[i] for j in done) for i in range(3)]
    print('\ntest: where the time went (wall %s)' % minutes(finished - began + (args.setup_seconds or 0)))
    if args.setup_seconds is not None:
        print('  %-60s %8s' % ('set-up (scripts/setup.sh)', minutes(args.setup_seconds)))
    print('  %-60s %8s' % ('build (cargo test --release --no-run)', minutes(built - began)))
    print('  %-60s %8s' % ('tests after the build (%d at a time)' % parallel, minutes(finished - built)))
    for job in sorted(done, key=lambda j: -j.seconds):
        print('    %-58s %8s  %s%s' % (job.name, minutes(job.seconds), 'ok' if job.status == 0 else 'FAILED',
                                       ' (started during the build)' if job.name in runner.plan['early'] else ''))
    print('test: %d passed, %d failed, %d ignored (Rust tests; the Python suites count as one each)'
          % tuple(total))
    if runner.failed:
        print('test: FAILED: %s' % ', '.join(runner.failed))
        sys.exit(1)


if __name__ == '__main__':
    main()
