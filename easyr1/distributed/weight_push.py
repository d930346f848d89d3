"""The weight push of a split placement: trainer rank 0 broadcasts the policy's full weights to the generators.

Under ``async_training.placement=split`` the generators hold only an engine; after each update the trainers' new
weights reach them through one broadcast group made of trainer rank 0 (its rank 0) and every generator (ranks 1..G).
The group is built once at start-up from its own TCP store (:func:`~easyr1.distributed.worker.rendezvous_store`:
served by trainer rank 0, on loopback when every worker is on one node), apart from both worker groups' process
groups: gloo on CPU, NCCL on GPU.

A push streams the weights in buckets: every trainer rank walks the full weights one FSDP group at a time (a
collective gather), rank 0 packs them into a byte bucket, and each bucket goes as three broadcasts: its sizes, a JSON
header (names, dtypes, shapes, offsets) and the bytes. A header size of 0 ends the push. The generators unpack each
bucket into views of it and hand them to their engine as they arrive, so neither side holds more than one bucket
beyond the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from easyr1.distributed.worker import bind_to_loopback, is_loopback, rendezvous_store


# A bucket's size: large enough that a small model goes in one, small enough to be a modest extra peak on either side.
BUCKET_BYTES = 256 * 1024**2
# Every tensor starts at a multiple of this in its bucket, so a view of any dtype can be taken at its offset.
ALIGNMENT = 64
# A push group member waits this long for the others (the trainers may still be updating when a generator joins).
PUSH_TIMEOUT = timedelta(minutes=30)
# The store's keys are under this prefix (the store serves nothing else, but a prefix keeps them apart from torch's).
STORE_PREFIX = "easyr1_weight_push"


@dataclass
class PushStats:
    """What one push moved: the bytes of the weights, the tensors, the buckets, and the seconds it took here."""

    bytes: int = 0
    tensors: int = 0
    buckets: int = 0
    seconds: float = 0.0
    checksum: float = 0.0  # the sum of every value sent or received (float64), to compare both sides


class WeightPushGroup:
    """This process's membership of the push group: rank 0 sends, every other rank receives.

    Args:
        rank: 0 for trainer rank 0, ``1 + g`` for generator ``g``.
        size: ``1 + G``.
        master_addr, master_port: where trainer rank 0 serves the group's TCP store.
        device: ``cuda`` (NCCL; tensors travel on the device) or ``cpu`` (gloo).
    """

    def __init__(self, rank: int, size: int, master_addr: str, master_port: int, device: str) -> None:
        self.rank, self.size, self.device = rank, size, device
        if is_loopback(master_addr):
            bind_to_loopback()
        store = dist.PrefixStore(STORE_PREFIX, rendezvous_store(rank, size, master_addr, master_port, PUSH_TIMEOUT))
        self._store = store  # kept alive with the group
        if device == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            self.group = dist.ProcessGroupNCCL(store, rank, size, options)
        else:
            self.group = dist.ProcessGroupGloo(store, rank, size, PUSH_TIMEOUT)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        self.group.broadcast(tensor, 0).wait()

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = BUCKET_BYTES) -> PushStats:
        """Broadcast ``named_tensors`` (rank 0 only) in buckets, then the end mark; returns what was sent."""
        stats = PushStats()
        entries: list[dict] = []
        pieces: list[torch.Tensor] = []
        filled = 0

        def flush() -> None:
            nonlocal entries, pieces, filled
            if not entries:
                return
            bucket = torch.empty(filled, dtype=torch.uint8, device=self.device)
            for entry, piece in zip(entries, pieces):
                bucket[entry["offset"] : entry["offset"] + entry["nbytes"]].copy_(piece)
            self._send_bucket(entries, bucket)
            stats.buckets += 1
            entries, pieces, filled = [], [], 0

        for name, tensor in named_tensors:
            flat = tensor.detach().to(self.device).contiguous().view(-1)
            stats.checksum += flat.double().sum().item()
            raw = flat.view(torch.uint8)
            if filled and filled + raw.numel() > bucket_bytes:
                flush()
            offset = _aligned(filled)
            entries.append(
                {
                    "name": name,
                    "dtype": str(tensor.dtype).removeprefix("torch."),
                    "shape": list(tensor.shape),
                    "offset": offset,
                    "nbytes": raw.numel(),
                }
            )
            pieces.append(raw)  # the gather hands out copies (or, on one rank, the unchanging parameters)
            filled = offset + raw.numel()
            stats.bytes += raw.numel()
            stats.tensors += 1
        flush()
        self._broadcast(torch.zeros(2, dtype=torch.int64, device=self.device))  # the end mark
        return stats

    def _send_bucket(self, entries: list[dict], bucket: torch.Tensor) -> None:
        header = torch.frombuffer(bytearray(json.dumps(entries).encode()), dtype=torch.uint8).to(self.device)
        self._broadcast(torch.tensor([header.numel(), bucket.numel()], dtype=torch.int64, device=self.device))
        self._broadcast(header)
        self._broadcast(bucket)

    def receive(self, stats: PushStats) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors rank 0 sends (every rank but 0), as views of their bucket, until the end mark; ``stats`` is
        filled as they arrive."""
        while True:
            sizes = torch.empty(2, dtype=torch.int64, device=self.device)
            self._broadcast(sizes)
            header_bytes, bucket_bytes = sizes.tolist()
            if header_bytes == 0:
                return
            header = torch.empty(header_bytes, dtype=torch.uint8, device=self.device)
            self._broadcast(header)
            bucket = torch.empty(bucket_bytes, dtype=torch.uint8, device=self.device)
            self._broadcast(bucket)
            stats.buckets += 1
            for entry in json.loads(header.cpu().numpy().tobytes().decode()):
                raw = bucket[entry["offset"] : entry["offset"] + entry["nbytes"]]
                tensor = raw.view(getattr(torch, entry["dtype"])).view(entry["shape"])
                stats.bytes += entry["nbytes"]
                stats.tensors += 1
                stats.checksum += tensor.double().sum().item()
                yield entry["name"], tensor

    def close(self) -> None:
        """Release the group (a worker process ending releases it too)."""
        shutdown = getattr(self.group, "shutdown", None)
        if shutdown is not None:
            shutdown()


def _aligned(offset: int) -> int:
    return (offset + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
