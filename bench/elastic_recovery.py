"""How long training stops when a worker dies: Hora's elastic job against torchrun's restart, in one run.

    python bench/elastic_recovery.py [--steps 100] [--kill-at 20] [--pause 0.05] [--repeats 3]

Two workers train a small MLP, resting ``--pause`` seconds after each step
(so the job lasts long enough for a replacement to join); the second
SIGKILLs itself before step ``--kill-at``. Each worker logs the time every
step ends.

- **hora**: ``horarun -np 2 --min-np 1`` over two host names of this machine,
  ``hora.torch.elastic.TorchState`` committed every step (in memory). The
  survivor restores the last commit and goes on alone; the dead worker's
  host is blacklisted for 1 to 2 s (``--blacklist-cooldown-range 1 2``,
  drawn at random), then a new worker starts there and the job grows back
  to two at a commit.
- **torchrun**: ``torchrun --nproc-per-node 2 --max-restarts 1`` (the c10d
  rendezvous, elastic agent polling every 0.1 s) with DDP over gloo, rank 0
  saving a checkpoint every step (torchrun restarts every worker, which load
  it): the way torch's elastic training recovers.

Reported, per peer, the median over ``--repeats`` launches: from the kill to
the end of the first step after it; from the kill to the first step with two
workers again (Hora's includes the blacklist cooldown); the whole run with
the kill and without; and a step's time without a kill (torchrun's includes
writing the checkpoint, which its recovery needs and Hora's in-memory commit
does not). Ratios are Hora's time over torchrun's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _peers import free_port  # noqa: E402 - bench/ is not a package

FEATURES, HIDDEN, BATCH = 256, 512, 64


def _log(directory: str, step: int, size: int) -> None:
    with open(os.path.join(directory, f"{os.getpid()}.log"), "a") as out:
        out.write(json.dumps({"time": time.time(), "step": step, "size": size}) + "\n")


def _kill(directory: str) -> None:
    with open(os.path.join(directory, "killed"), "w") as out:
        out.write(str(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def _model() -> tuple:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 10))
    return model, torch.randn(BATCH, FEATURES), torch.randint(0, 10, (BATCH,))


def hora_worker(steps: int, kill_at: int, pause: float, directory: str) -> None:
    import hora.torch as hvd
    import torch

    hvd.init()
    model, x, y = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    doomed = os.environ["HORA_WORKER_INDEX"] == "1" and kill_at >= 0

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.step < steps:
            if doomed and state.step == kill_at:
                _kill(directory)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            state.step += 1
            _log(directory, state.step, hvd.size())
            state.commit()
            time.sleep(pause)

    train(state)


def torchrun_worker(steps: int, kill_at: int, pause: float, directory: str) -> None:
    import torch
    import torch.distributed as dist

    # The agent's store outlives a restart; a prefix per restart keeps the new workers from reading the
    # addresses their predecessors published there.
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_store and rank == 0, timeout=timedelta(seconds=60))  # fmt: skip
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", store=dist.PrefixStore(f"bench/restart{restart}", store), rank=rank,
                            world_size=world)  # fmt: skip
    model, x, y = _model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    checkpoint = Path(directory, "checkpoint.pt")
    step = 0
    if checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
    doomed = dist.get_rank() == 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" and kill_at >= 0
    while step < steps:
        if doomed and step == kill_at:
            _kill(directory)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        step += 1
        _log(directory, step, dist.get_world_size())
        if dist.get_rank() == 0:  # what torchrun's restart resumes from
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                       checkpoint.with_suffix(".tmp"))  # fmt: skip
            os.replace(checkpoint.with_suffix(".tmp"), checkpoint)
        time.sleep(pause)
    dist.destroy_process_group()


def launch(peer: str, steps: int, kill_at: int, pause: float) -> dict[str, float]:
    """One launch of ``peer``; its timings in seconds."""
    with tempfile.TemporaryDirectory(prefix="hora-recovery-") as directory:
        arguments = ["--worker", peer, "--steps", str(steps), "--kill-at", str(kill_at), "--pause", str(pause),
                     "--dir", directory]  # fmt: skip
        if peer == "hora":
            command = [sys.executable, "-m", "hora.runner", "-np", "2", "--min-np", "1", "--max-np", "2",
                       "-H", "localhost:1,127.0.0.1:1", "--blacklist-cooldown-range", "1", "2",
                       "--network-interface", "lo", sys.executable, __file__, *arguments]  # fmt: skip
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                       "--max-restarts", "1", "--monitor-interval", "0.1", "--rdzv-backend", "c10d",
                       "--rdzv-endpoint", f"127.0.0.1:{free_port()}", __file__, *arguments]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        started = time.time()
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
        ended = time.time()
        if done.returncode != 0:
            raise RuntimeError(f"{peer} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        rows = [dict(json.loads(line), pid=log.stem) for log in Path(directory).glob("*.log")
                for line in log.read_text().splitlines()]  # fmt: skip
        timings = {"job": ended - started}
        first_worker = min(rows, key=lambda r: r["time"])["pid"]
        times = sorted(r["time"] for r in rows if r["pid"] == first_worker)
        timings["step"] = statistics.median(b - a for a, b in itertools.pairwise(times)) - pause
        killed_file = Path(directory, "killed")
        if killed_file.exists():
            killed = float(killed_file.read_text())
            after = sorted(r["time"] for r in rows if r["time"] > killed)
            both = sorted(r["time"] for r in rows if r["time"] > killed and r["size"] == 2)
            timings["resumed"] = after[0] - killed
            timings["two_again"] = both[0] - killed if both else float("nan")
        return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--kill-at", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", choices=["hora", "torchrun"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        (hora_worker if args.worker == "hora" else torchrun_worker)(args.steps, args.kill_at, args.pause, args.dir)
        return
    results: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.repeats):  # interleaved, so both peers see the same phases of the machine
        for peer in ("hora", "torchrun"):
            for kill in (True, False):
                timings = launch(peer, args.steps, args.kill_at if kill else -1, args.pause)
                for name, seconds in timings.items():
                    key = name if kill else f"{name}_without_kill"
                    results.setdefault(peer, {}).setdefault(key, []).append(seconds)
    median = {peer: {k: statistics.median(v) for k, v in r.items()} for peer, r in results.items()}
    print(f"{args.steps} steps ({args.pause:g} s rest after each), worker 1 killed before step {args.kill_at}; "
          f"medians of {args.repeats} launches\n")  # fmt: skip
    print("| measure | hora | torchrun | hora / torchrun |")
    print("|---|---|---|---|")
    for key, label in (("resumed", "kill -> a step ends again"), ("two_again", "kill -> a step with 2 workers"),
                       ("job", "whole job, one kill"), ("job_without_kill", "whole job, no kill"),
                       ("step_without_kill", "one step's work, no kill")):  # fmt: skip
        h, t = median["hora"][key], median["torchrun"][key]
        print(f"| {label} | {h * 1000:.1f} ms | {t * 1000:.1f} ms | {h / t:.2f} |")


if __name__ == "__main__":
    main()
