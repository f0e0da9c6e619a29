"""The Ray provider on a local Ray cluster (skipped where ray is not installed: it is the
optional extra `surge[ray]`): a replica started as an actor serves, then drains to exit 0."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest

ray = pytest.importorskip("ray")

from surge.autoscale.providers.base import ReplicaState  # noqa: E402
from surge.autoscale.providers.ray import RayProvider, RayProviderConfig  # noqa: E402
from tests.servers import free_port, log_dir  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_ray_replica_serves_and_drains(tiny_model_dir: Path) -> None:
    serve_args = ("--model", str(tiny_model_dir), "--dtype", "float32",
                  "--kv-cache-memory-gib", "0.1", "--served-model-name", "test-model")  # fmt: skip
    config = RayProviderConfig(serve_args, None, num_cpus=1, base_port=free_port(),
                               host="127.0.0.1", log_dir=str(log_dir()))  # fmt: skip
    provider = RayProvider(config)
    try:

        async def scenario() -> tuple[int | None, bool]:
            replica = await provider.start()
            assert replica.state is ReplicaState.READY and provider.replicas() == [replica]
            assert replica.url.startswith("http://127.0.0.1:")  # loopback only in tests
            await provider.refresh()
            assert provider.alive(replica)
            client = openai.AsyncOpenAI(base_url=replica.url + "/v1", api_key="none")
            async with client:
                out = await client.completions.create(
                    model="test-model", prompt="hello", max_tokens=5,
                    extra_body={"ignore_eos": True},
                )  # fmt: skip
            assert out.usage is not None and out.usage.completion_tokens == 5
            await provider.drain(replica, timeout_s=30)
            return replica.exit_code, replica.state is ReplicaState.STOPPED

        exit_code, stopped = asyncio.run(scenario())
        assert exit_code == 0 and stopped and provider.replicas() == []
    finally:
        asyncio.run(provider.close(timeout_s=10))
        ray.shutdown()
