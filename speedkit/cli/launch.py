"""``speedkit launch``: a script on N processes per machine through torchrun, which a Trainer in it trains with
DDP (or FSDP)."""
from __future__ import annotations

import argparse
import sys


def add_parser(commands) -> None:
    launch = commands.add_parser(
        "launch", allow_abbrev=False, help="run a script on N processes per machine with torchrun (DDP in the Trainer)",
        description="A thin front to torchrun (torch.distributed.run): one process per device, each with RANK, "
                    "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set; a Trainer in the script then trains "
                    "with DDP (or parallel='fsdp'). One machine: `speedkit launch -n 4 train.py`. Several: run the "
                    "same command on each with --nnodes, --node-rank and a shared --master-addr/--master-port, or "
                    "with --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id JOB.",
        epilog="examples:\n  speedkit launch -n 2 train.py --lr 0.1\n"
               "  speedkit launch -n 2 -m speedkit train --task fashion-mnist --recipe mild\n"
               "  speedkit launch -n 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 train.py",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    launch.add_argument("-n", "--nproc-per-node", type=int, default=1, help="processes on this machine (default 1)")
    launch.add_argument("--nnodes", default="1", help="machines taking part, or MIN:MAX for elastic jobs")
    launch.add_argument("--node-rank", type=int, default=0, help="this machine's index, 0 .. nnodes-1")
    launch.add_argument("--master-addr", help="address of the machine with node rank 0 (static rendezvous)")
    launch.add_argument("--master-port", type=int, help="a free port on that machine")
    launch.add_argument("--rdzv-backend", help="rendezvous backend, e.g. c10d (then --rdzv-endpoint, --rdzv-id)")
    launch.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous")
    launch.add_argument("--rdzv-id", help="a job id shared by every machine of the run")
    launch.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module, run as with python -m")
    launch.add_argument("script", help="the training script (or module, with -m)")
    launch.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed on to the script")


def torchrun_args(args) -> list[str]:
    """torchrun's command line for ``speedkit launch``'s arguments."""
    if args.nproc_per_node < 1:
        raise ValueError(f"-n/--nproc-per-node must be at least 1, got {args.nproc_per_node}")
    argv = ["--nproc-per-node", str(args.nproc_per_node), "--nnodes", str(args.nnodes)]
    rendezvous = [args.master_addr, args.master_port, args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id]
    if str(args.nnodes) == "1" and all(v is None for v in rendezvous):
        argv.append("--standalone")  # one machine: torchrun picks a free port itself
    else:
        argv += ["--node-rank", str(args.node_rank)]
        for flag, value in (("--master-addr", args.master_addr), ("--master-port", args.master_port),
                            ("--rdzv-backend", args.rdzv_backend), ("--rdzv-endpoint", args.rdzv_endpoint),
                            ("--rdzv-id", args.rdzv_id)):
            if value is not None:
                argv += [flag, str(value)]
    if args.module:
        argv.append("--module")
    return argv + [args.script, *args.script_args]


def run(args) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    argv = torchrun_args(args)
    try:
        torchrun(argv)
    except ChildFailedError as e:
        print(f"speedkit launch: {e.name} failed:\n{e.format_msg()}", file=sys.stderr)
        return 1
    return 0
