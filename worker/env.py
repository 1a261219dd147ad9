"""The torchrun environment a worker daemon is started with."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class TorchrunEnv:
    """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int

    @classmethod
    def from_environ(cls, environ=os.environ) -> TorchrunEnv:
        def read(name: str, default: str | None = None) -> str:
            value = environ.get(name, default)
            if value is None:
                raise ValueError(f"worker needs the environment variable {name} (set by tprun)")
            return value

        env = cls(
            rank=int(read("RANK", "0")),
            local_rank=int(read("LOCAL_RANK", read("RANK", "0"))),
            world_size=int(read("WORLD_SIZE", "1")),
            local_world_size=int(read("LOCAL_WORLD_SIZE", read("WORLD_SIZE", "1"))),
            master_addr=read("MASTER_ADDR", "127.0.0.1"),
            master_port=int(read("MASTER_PORT", "29500")),
        )
        if not 0 <= env.rank < env.world_size:
            raise ValueError(f"RANK {env.rank} outside WORLD_SIZE {env.world_size}")
        return env

    def as_environ(self) -> dict[str, str]:
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


# NVLink multicast (NVLS) stays off in every process tprun starts; NCCL,
# torch's symmetric memory and NVSHMEM each have their own switch for it.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


def disable_multicast(environ=os.environ) -> None:
    """Set the NO_MULTICAST variables where ``environ`` does not set them.

    Called before the process group (NCCL communicators) or any symmetric
    memory exists, which is when these libraries read them.
    """
    for name, value in NO_MULTICAST.items():
        environ.setdefault(name, value)
