"""runtime.device.gpu_identity: the one read of a GPU's name, UUID, capability, memory and SM count, and its readers
(checked on the CPU with torch's device properties faked)."""

from __future__ import annotations

import types

import pytest
import torch

from perflab.runtime.device import GpuIdentity, gpu_identity

H100 = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", uuid="5e2f1c3a-0000-4000-8000-000000000001", major=9, minor=0,
                             total_memory=85_520_809_984, multi_processor_count=132)


@pytest.fixture
def fake_gpu(monkeypatch):
    asked = []

    def properties(index):
        asked.append(index)
        return H100

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    return asked


def test_gpu_identity_of_the_current_device_and_of_an_index(fake_gpu):
    assert gpu_identity() == GpuIdentity(1, "NVIDIA H100 80GB HBM3", "GPU-5e2f1c3a-0000-4000-8000-000000000001", (9, 0), 85_520_809_984, 132)
    assert gpu_identity(3).index == 3 and fake_gpu == [1, 3]


def test_a_uuid_already_in_nvmls_spelling_is_kept(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(**dict(vars(H100), uuid="GPU-abc")))
    assert gpu_identity(0).uuid == "GPU-abc"


def test_the_environment_and_the_ceilings_key_read_it(fake_gpu, monkeypatch):
    from perflab.measure import ceilings
    from perflab.measure.env import environment

    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91000)
    env = environment("cuda")
    assert (env["gpu_name"], env["gpu_memory_gb"], env["compute_capability"], env["sm_count"]) == ("NVIDIA H100 80GB HBM3", 79.6, "9.0", 132)
    assert ceilings.gpu_key().startswith("NVIDIA H100 80GB HBM3|driver ")


def test_a_memory_cap_is_a_share_of_its_memory(fake_gpu, monkeypatch):
    from perflab.runtime.workload import memory_cap

    shares = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", shares.append)
    with memory_cap(types.SimpleNamespace(max_memory=85_520_809_984 // 4, device="cuda")):
        pass
    assert shares == [0.25, 1.0]
