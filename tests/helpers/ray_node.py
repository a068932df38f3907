"""A node of a real Ray cluster on 127.0.0.1, one process group per node, for the tests that
run on Ray (test_ray_cluster.py) and benchmarks/ray_sweep.py.

``python ray_node.py head DIR`` starts a head node (its GCS address goes to DIR/address);
``python ray_node.py node ADDRESS [HIDDEN...]`` a worker node joining it, in a mount namespace
of its own where each HIDDEN directory is an empty tmpfs: the node's workers do not see what
the driver put there, as a node without the shared filesystem would not, and its temporary
directory is the first of them. Each node has one CPU.
The process stays until it is killed; killing its process group kills the node's raylet and
workers, as a machine that goes down does.

Ray resolves 127.0.0.1 to the machine's outward address unless
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, so the tests set that for every process of the cluster
and the driver (``ray start`` refuses it for a second node, hence Ray's own node class here).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x00020000, 0x4000, 1 << 18


def hide(dirs: list[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    for d in dirs:
        if libc.mount(b"tmpfs", d.encode(), b"tmpfs", 0, None) != 0:
            raise OSError(ctypes.get_errno(), f"mount tmpfs on {d}")


def main(kind: str, where: str, hidden: list[str]) -> None:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if hidden:
        hide(hidden)
        # The node's own temporary directory, inside what it hides: its workers' tempfile (where
        # --ship-base puts the node's copy) is not the driver's; Ray's session stays shared.
        os.environ.setdefault("RAY_TMPDIR", os.environ.get("TMPDIR", "/tmp"))
        os.environ["TMPDIR"] = os.path.join(hidden[0], "tmp")
        os.makedirs(os.environ["TMPDIR"])
    import ray._private.node
    import ray._private.parameter

    common = {"num_cpus": 1, "num_gpus": 0, "object_store_memory": 150 << 20, "min_worker_port": 0,
              "max_worker_port": 0, "node_ip_address": "127.0.0.1"}  # fmt: skip
    if kind == "head":
        params = ray._private.parameter.RayParams(include_dashboard=False, **common)
        node = ray._private.node.Node(params, head=True, shutdown_at_exit=True, spawn_reaper=True)
        with open(os.path.join(where, "address.tmp"), "w") as f:
            f.write(node.gcs_address)
        os.replace(os.path.join(where, "address.tmp"), os.path.join(where, "address"))
    else:
        params = ray._private.parameter.RayParams(
            gcs_address=where, include_log_monitor=False, node_manager_port=0, **common
        )
        params.dashboard_agent_listen_port = None
        node = ray._private.node.Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
    print(node.node_id, flush=True)  # the test knows which node it kills or hides things from
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
