"""Host tensors through Ray with easyr1's compact pickling (``distributed/tensor_pickling.py``): the same values
arrive, writable and with storage of their own, only the elements a tensor shows travel, and what torch pickles
itself (tensors that require grad, subclasses) is left to torch."""

from __future__ import annotations

import numpy as np
import pytest
import ray
import ray.cloudpickle
import torch
from helpers import start_ray

from easyr1.distributed import Worker, WorkerGroup
from easyr1.distributed.sample_cache import payload_bytes
from easyr1.distributed.tensor_pickling import rebuild


pytestmark = pytest.mark.ray


class Echo(Worker):
    """Sends back what it got, after changing it in place when asked."""

    def echo(self, value):
        return value

    def doubled_in_place(self, tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[int]]:
        for tensor in tensors:
            tensor.mul_(2)
        return tensors, [tensor.untyped_storage().data_ptr() for tensor in tensors]

    def wire_bytes_of_a_slice(self, rows: int) -> int:
        return wire_bytes(torch.zeros(1000, 100)[:rows])


def wire_bytes(value) -> int:
    """Bytes Ray's pickling of ``value`` in this process writes: the pickle plus its out-of-band buffers."""
    buffers = []
    pickled = ray.cloudpickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return len(pickled) + sum(buffer.raw().nbytes for buffer in buffers)


@pytest.fixture(scope="module")
def group():
    start_ray()
    workers = WorkerGroup(Echo, 1)
    yield workers
    workers.shutdown()


def cases() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(6, 4, generator=generator)
    return {
        "float32": base,
        "bfloat16": base.to(torch.bfloat16),
        "int64 transposed": torch.arange(12).reshape(3, 4).t(),
        "rows of a larger tensor": base[2:5],
        "every other column": base[:, ::2],
        "bool": base > 0,
        "0-d float64": torch.tensor(3.25, dtype=torch.float64),
        "empty": torch.zeros(0, 5),
        "empty bfloat16": torch.zeros(2, 0, 3, dtype=torch.bfloat16),
        "complex64": torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
        "mrope positions": torch.arange(3 * 2 * 7).reshape(3, 2, 7),
    }


def test_values_dtypes_and_shapes_survive_the_round_trip(group):
    sent = cases()
    received = group.run_all(Echo.echo, sent)[0]
    assert list(received) == list(sent)
    for name, tensor in sent.items():
        got = received[name]
        assert type(got) is torch.Tensor, name
        assert (got.dtype, got.shape) == (tensor.dtype, tensor.shape), name
        assert torch.equal(got, tensor), name


def test_what_torch_pickles_itself_keeps_its_kind(group):
    weight = torch.nn.Parameter(torch.randn(3, 2))
    grad_tensor = torch.randn(4, requires_grad=True)
    got_weight, got_grad_tensor = group.run_all(Echo.echo, (weight, grad_tensor))[0]
    assert type(got_weight) is torch.nn.Parameter and torch.equal(got_weight.detach(), weight.detach())
    assert got_grad_tensor.requires_grad and torch.equal(got_grad_tensor.detach(), grad_tensor.detach())


def test_received_tensors_are_writable_and_own_their_storage(group):
    base = torch.arange(8, dtype=torch.float32)
    view = base[2:6]
    (doubled_base, doubled_view), pointers = group.run_all(Echo.doubled_in_place, [base, view])[0]
    # two views of one storage arrive as two tensors, each changed alone
    assert pointers[0] != pointers[1]
    assert torch.equal(doubled_base, base * 2)
    assert torch.equal(doubled_view, view * 2)
    assert torch.equal(base, torch.arange(8, dtype=torch.float32))  # the driver's own tensors are untouched


def test_rebuild_copies_out_of_a_read_only_buffer():
    # what Ray hands over: a read-only view of the received message (or of the object store)
    data = np.frombuffer(torch.tensor([1.5, -2.0, 3.0]).numpy().tobytes(), dtype=np.uint8)
    assert not data.flags.writeable
    tensor = rebuild(data, torch.float32, (3,))
    assert tensor.data_ptr() != data.ctypes.data
    tensor.mul_(2)
    assert torch.equal(tensor, torch.tensor([3.0, -4.0, 6.0]))
    assert np.frombuffer(data.tobytes(), dtype=np.float32).tolist() == [1.5, -2.0, 3.0]


def test_a_slice_sends_its_rows_not_the_whole_storage(group):
    rows, row_bytes, whole = 3, 100 * 4, 1000 * 100 * 4
    overhead = 1000  # the pickle's own opcodes, the dtype and the shape
    big = torch.zeros(1000, 100)
    # the driver's messages (WorkerGroup installed the pickling here) and the worker's replies
    assert rows * row_bytes <= wire_bytes(big[:rows]) < rows * row_bytes + overhead
    assert rows * row_bytes <= group.run_all(Echo.wire_bytes_of_a_slice, rows)[0] < rows * row_bytes + overhead
    # the driver's byte counts follow: the slice's own bytes, a tensor torch pickles itself its whole storage
    assert payload_bytes(big[:rows]) == rows * row_bytes
    assert payload_bytes(big.requires_grad_()[:rows]) == whole
