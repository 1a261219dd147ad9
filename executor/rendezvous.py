"""The store the worker daemons' process group meets through, held by the executor.

torch.distributed's ranks rendezvous through a TCPStore at MASTER_ADDR:
MASTER_PORT, and NCCL's watchdog thread keeps polling that store while a
group lives. So the store must outlive every rank's group. Left to
``init_method="env://"``, rank 0 hosts it, and rank 0 exiting before rank 1
has destroyed its group makes rank 1's watchdog log store errors. As
torchrun's agent does, the executor hosts the store instead and the workers
join it as clients (``TORCHELASTIC_USE_AGENT_STORE=True``); the executor lets
it go only after every worker process has exited.
"""

from __future__ import annotations

import datetime

AGENT_STORE_ENV = {"TORCHELASTIC_USE_AGENT_STORE": "True"}


def host_store(addr: str, port: int, timeout_s: float = 600.0):
    """A TCPStore served from this process at ``addr:port`` (0: any free
    port; the store's ``port`` says which)."""
    import torch.distributed as dist

    return dist.TCPStore(addr, port, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))
