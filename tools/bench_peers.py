#!/usr/bin/python3
"""Peers for the communication benchmark, measured in the same run: torch.distributed's
gloo all-reduce (Debian's python3-torch) and one iperf3 TCP stream on loopback.

Prints Markdown rows: | peer | ranks | size | time ms | busbw GB/s |
"""
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_worker(rank, world, port, elements, reps, out):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    t = torch.ones(elements)
    times = []
    for i in range(reps + 1):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        dist.barrier()
        if i > 0:
            times.append(time.perf_counter() - start)
    if rank == 0:
        out.put(statistics.median(times))
    dist.destroy_process_group()


def gloo(world, mib, reps=5):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    elements = mib << 18
    procs = [ctx.Process(target=gloo_worker, args=(r, world, port, elements, reps, out))
             for r in range(world)]
    for p in procs:
        p.start()
    seconds = out.get(timeout=600)
    for p in procs:
        p.join()
    busbw = mib * (1 << 20) / seconds * 2 * (world - 1) / world / 1e9
    return seconds, busbw


def iperf3(seconds=3):
    if shutil.which("iperf3") is None:
        return None
    port = str(free_port())
    server = subprocess.Popen(["iperf3", "-s", "-1", "-p", port], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", port, "-t", str(seconds), "-J"],
                             capture_output=True, text=True, timeout=30).stdout
        import json
        bits = json.loads(out)["end"]["sum_received"]["bits_per_second"]
        return bits / 8 / 1e9
    finally:
        server.wait(timeout=10)


def main():
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        print("| torch.distributed gloo | - | - | not installed (apt-get install python3-torch) | - |")
        return
    for world in (2, 4):
        for mib in (16, 64):
            seconds, busbw = gloo(world, mib)
            print(f"| torch.distributed gloo | {world} | {mib} MiB | {seconds * 1e3:.1f} | "
                  f"{busbw:.3f} |", flush=True)
    gbps = iperf3()
    if gbps is None:
        print("| iperf3 one TCP stream | 1 | - | not installed (apt-get install iperf3) | - |")
    else:
        print(f"| iperf3 one TCP stream | 1 | 3 s | - | {gbps:.3f} (throughput) |")


if __name__ == "__main__":
    sys.exit(main())
