"""horarun for an elastic job: its workers are processes (see :mod:`hora.runner.elastic_job` for the job).

horarun asks the host discovery script (or uses the fixed ``-H`` hosts),
then runs an :class:`~hora.runner.elastic_job.ElasticJob` whose workers it
starts as it starts any worker (under the guard, locally or over ssh; see
:mod:`hora.runner.worker`). Each worker gets a fresh index, never reused;
output lines carry it (``[index]<stdout>:``). The rank variables a worker
starts with (``HORA_RANK`` ...) are its expected place; ``hora.rank()``
after ``init`` is the truth. Ctrl-C stops every worker.
"""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

from hora.runner.config import ElasticConfig, LaunchConfig
from hora.runner.discovery import DiscoveryError, ScriptDiscovery, fixed_hosts
from hora.runner.elastic_job import ElasticJob
from hora.runner.failure import shell_code
from hora.runner.hosts import is_local
from hora.runner.launch import guarded_argv, job_env, listen_addresses, stop_workers
from hora.runner.worker import Worker, guard_header

__all__ = ["launch_elastic"]


def launch_elastic(config: LaunchConfig, elastic: ElasticConfig) -> int:
    """Runs an elastic job; returns its exit code (0, or the failing worker's, or 1 when the job cannot go on)."""
    discover = (
        ScriptDiscovery(elastic.discovery_script, elastic.slots_per_host)
        if elastic.discovery_script
        else fixed_hosts(config.hosts)
    )
    try:
        first = discover()
    except DiscoveryError as exc:
        print(f"horarun: {exc}", file=sys.stderr)
        return 2
    driver_host, bind = listen_addresses(config, first)
    job = ElasticJob(
        discover,
        num_workers=config.num_proc,
        min_workers=elastic.min_np,
        max_workers=elastic.max_np,
        start_timeout=config.start_timeout,
        elastic_timeout=elastic.elastic_timeout,
        reset_limit=elastic.reset_limit,
        cooldown_range=elastic.cooldown_range,
        host=driver_host,
        report=lambda text: print(f"horarun: {text}", file=sys.stderr),
    )
    try:
        job.wait_for_slots()
    except (DiscoveryError, TimeoutError) as exc:
        job.service.stop()
        print(f"horarun: {exc}", file=sys.stderr)
        return 1
    advertised = job.service.address
    if advertised[0] == "0.0.0.0":
        advertised = (socket.gethostname(), advertised[1])
    base_env = job_env(config)
    output_dir = Path(config.output_filename) if config.output_filename else None

    def start(index: int, host: str, place: dict[str, str]) -> Worker:
        env = dict(base_env, **job.contract(index, place, driver=advertised, bind=bind).to_env())
        header = guard_header(job.secret, env, local=is_local(host))
        argv = guarded_argv(config, host)
        return Worker(index, index, host, argv, env, header, output_dir, config.prefix_output_with_timestamp)

    previous_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with job.service:
            outcome = job.run(start)
    except KeyboardInterrupt:
        print("horarun: interrupted; stopping every worker.", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
        stop_workers(job.handles())  # type: ignore[arg-type]
    for worker in job.handles():
        worker.join_output(5.0)  # type: ignore[attr-defined]
    if outcome.message is not None:
        text = f"horarun: {outcome.message}"
        if outcome.culprit is not None:
            text += f" Last lines:\n{outcome.culprit.last_lines()}"
        print(text, file=sys.stderr)
    return shell_code(outcome.exit_code)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
