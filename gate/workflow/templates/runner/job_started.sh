#!/usr/bin/env bash
# attn-gate's runner guard, run by the self-hosted runner before every job: set the runner's
# environment ACTIONS_RUNNER_HOOK_JOB_STARTED=/opt/attn-gate-runner/job_started.sh (its .env file).
# Install this file, job_started.py and the group's settings root-owned and not writable by the
# runner user (docs/ci.md, "The runner guard"). The paths are fixed here, not read from the
# environment, and python3 runs isolated (-I: no PYTHON* variables, no user site), so nothing a
# job or a variable sets reaches the guard. A non-zero exit alone would not stop the job (its
# always() and pre: steps still run): the guard ends a job it refuses, and the runner, itself.
set -euo pipefail
exec /usr/bin/python3 -I /opt/attn-gate-runner/job_started.py --config /etc/attn-gate-runner/guard.json
