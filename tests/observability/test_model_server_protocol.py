"""A `surge serve` replica speaks the model-server protocol an endpoint picker reads (llm-d's
router, the Gateway API Inference Extension), checked against the document itself:
model-server-protocol.md beside this file is llm-d/llm-d-router's docs/model-server-protocol.md
(commit b40411275b19cb0892d787d2c485614ba25007ae, Apache-2.0), byte for byte.

From its table (the vLLM column) and its LoRA section: each metric's name, type and labels on
the replica's /metrics, and values that mean what the document says.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import ServerProcess

DOC = Path(__file__).with_name("model-server-protocol.md")
DOC_SHA256 = "59a0726430ff2e24d9495e0f54693c66a1ef862aeb64dfd30b24043c11a2e908"


def required_metrics() -> dict[str, tuple[str, set[str]]]:
    """vLLM's name -> (the document's type, the labels it names), from the table and the LoRA
    section."""
    text = DOC.read_text(encoding="utf-8")
    out: dict[str, tuple[str, set[str]]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 5 or not cells[4].count("`vllm:"):
            continue
        kind = cells[2].split("/")[-1]  # "Labeled/Gauge": a gauge with labels
        name = re.search(r"`(vllm:[a-z_]+)`", cells[4])
        label = re.search(r"label name: `([a-z_]+)`", cells[4])
        assert name is not None
        _, labels = out.get(name.group(1), (kind, set()))
        out[name.group(1)] = (kind, labels | ({label.group(1)} if label else set()))
    lora = text.split("## LoRA Adapter Serving", 1)[1].split("## ", 1)[0]
    lora_name = re.search(r"implemented in vLLM: `(vllm:[a-z_]+)`", lora)
    lora_type = re.search(r"Metric type: (\w+)", lora)
    assert lora_name is not None and lora_type is not None
    lora_labels = set(re.findall(r"^\s+\* `([a-z_]+)`:", lora, re.MULTILINE))
    out[lora_name.group(1)] = (lora_type.group(1), lora_labels)
    return out


def test_the_vendored_document_is_the_one_read() -> None:
    import hashlib

    assert hashlib.sha256(DOC.read_bytes()).hexdigest() == DOC_SHA256
    assert required_metrics() == {
        "vllm:num_requests_waiting": ("Gauge", set()),
        "vllm:num_requests_running": ("Gauge", set()),
        "vllm:kv_cache_usage_perc": ("Gauge", set()),
        "vllm:cache_config_info": ("Gauge", {"block_size", "num_gpu_blocks"}),
        "vllm:lora_requests_info": (
            "Gauge", {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
        ),
    }  # fmt: skip


@pytest.fixture(scope="module")
def replica(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    """A replica that serves LoRA adapters (the document's LoRA section applies to it)."""
    server = ServerProcess(tiny_model_dir, "--dtype", "float32", "--enable-lora",
                           "--max-loras", "3")  # fmt: skip
    yield server
    server.stop()


def test_replica_metrics_follow_the_model_server_protocol(replica: ServerProcess) -> None:
    r = httpx.post(replica.url + "/v1/completions", timeout=60,
                   json={"model": "test-model", "prompt": "hello", "max_tokens": 4})  # fmt: skip
    assert r.status_code == 200, r.text
    text = httpx.get(replica.url + "/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, (kind, labels) in required_metrics().items():
        family = families.get(name)
        assert family is not None, f"{name} missing from /metrics"
        assert family.type == kind.lower(), (name, family.type)
        (sample,) = [s for s in family.samples if s.name == name]  # one current reading
        assert labels <= set(sample.labels), (name, sample.labels)
    value = {n: families[n].samples[0] for n in required_metrics()}
    assert value["vllm:num_requests_waiting"].value == 0  # nothing queued now
    assert value["vllm:num_requests_running"].value == 0
    assert 0 <= value["vllm:kv_cache_usage_perc"].value <= 1  # a fraction, as vLLM's
    config = value["vllm:cache_config_info"].labels
    assert int(config["block_size"]) > 0 and int(config["num_gpu_blocks"]) > 0
    lora = value["vllm:lora_requests_info"]
    assert lora.labels["max_lora"] == "3"
    assert lora.labels["running_lora_adapters"] == lora.labels["waiting_lora_adapters"] == ""
    assert abs(lora.value - time.time()) < 120  # the time of the reading, as the doc says
