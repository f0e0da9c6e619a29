"""LoRA adapters through HTTP with the official `openai` client: a request's `model` names an
adapter, /v1/models lists them, vLLM's load/unload routes change them while serving, and
concurrent base and adapter requests answer as they do alone."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from surge.engine.llm import LLM
from surge.sampling_params import SamplingParams
from tests.lora_adapters import write_peft_adapter
from tests.servers import ServerProcess

PROMPTS = ["Hello there", "The quick brown fox", "def fib(n):", "Paged attention keeps"]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("http-loras")
    return {
        "all": write_peft_adapter(tiny_model_dir, root / "all", r=8, seed=1),
        "qv": write_peft_adapter(
            tiny_model_dir, root / "qv", r=4, targets=("q_proj", "v_proj"), seed=2, scale=2.0
        ),
        "big": write_peft_adapter(tiny_model_dir, root / "big", r=32, seed=3),
    }


@pytest.fixture(scope="module")
def expected(tiny_model_dir: Path, adapter_dirs: dict[str, Path]) -> dict[str | None, list[str]]:
    """Greedy texts per adapter from the offline engine (itself checked against PEFT)."""
    llm = LLM(str(tiny_model_dir), dtype="float32",
              lora_modules={n: str(adapter_dirs[n]) for n in ("all", "qv")})  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return {
        name: [o.outputs[0].text for o in llm.generate(PROMPTS, params, False, lora_name=name)]
        for name in (None, "all", "qv")
    }


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, adapter_dirs: dict[str, Path]) -> Iterator[ServerProcess]:
    s = ServerProcess(
        tiny_model_dir, "--dtype", "float32", "--lora-modules", f"all={adapter_dirs['all']}",
        "--max-loras", "2", "--allow-runtime-lora-updating",
    )  # fmt: skip
    yield s
    s.stop()


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _complete(server: ServerProcess, model: str, prompt: str) -> str:
    resp = _client(server).completions.create(
        model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert resp.model == model
    return resp.choices[0].text


def test_models_lists_adapters(server: ServerProcess, adapter_dirs: dict[str, Path]) -> None:
    models = {m.id: m for m in _client(server).models.list().data}
    assert set(models) == {"test-model", "all"}
    card = models["all"].model_dump()
    assert card["parent"] == "test-model" and card["root"] == str(adapter_dirs["all"])


def test_adapter_requests(server: ServerProcess, expected: dict[str | None, list[str]]) -> None:
    assert expected["all"] != expected[None]
    for i, prompt in enumerate(PROMPTS[:2]):
        assert _complete(server, "all", prompt) == expected["all"][i]
        assert _complete(server, "test-model", prompt) == expected[None][i]
    stream = _client(server).chat.completions.create(
        model="all", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
    )
    chunks = list(stream)
    assert chunks and all(c.model == "all" for c in chunks)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        _complete(server, "no-such-adapter", "Hello")


def test_concurrent_base_and_adapter(
    server: ServerProcess, expected: dict[str | None, list[str]]
) -> None:
    jobs = [(m, i) for i in range(len(PROMPTS)) for m in ("test-model", "all")]
    with ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(lambda j: _complete(server, j[0], PROMPTS[j[1]]), jobs))
    for (model, i), text in zip(jobs, texts, strict=True):
        assert text == expected[None if model == "test-model" else "all"][i]
    info = _metric_labels(server, "vllm:lora_requests_info")
    assert info and info[0]["max_lora"] == "2"


def _metric_labels(server: ServerProcess, name: str) -> list[dict[str, str]]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics", timeout=5).text
    return [s.labels for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name]  # fmt: skip


def test_load_and_unload_at_run_time(
    server: ServerProcess, adapter_dirs: dict[str, Path], expected: dict[str | None, list[str]]
) -> None:
    def post(route: str, **body: str) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/{route}", json=body, timeout=30)

    r = post("load_lora_adapter", lora_name="qv", lora_path=str(adapter_dirs["qv"]))
    assert r.status_code == 200, r.text
    assert "qv" in {m.id for m in _client(server).models.list().data}
    assert _complete(server, "qv", PROMPTS[2]) == expected["qv"][2]
    # Refusals, each with its reason in the OpenAI error shape.
    r = post("load_lora_adapter", lora_name="qv", lora_path=str(adapter_dirs["qv"]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "lora_exists"
    r = post("load_lora_adapter", lora_name="x", lora_path=str(adapter_dirs["qv"]))
    assert r.status_code == 400 and "LoRA slots are in use" in r.json()["error"]["message"]
    r = post("unload_lora_adapter", lora_name="qv")
    assert r.status_code == 200, r.text
    r = post("load_lora_adapter", lora_name="big", lora_path=str(adapter_dirs["big"]))
    assert r.status_code == 400 and "--max-lora-rank 16" in r.json()["error"]["message"]
    r = post("load_lora_adapter", lora_name="nowhere", lora_path="/nonexistent/adapter")
    assert r.status_code == 400 and "adapter_config.json" in r.json()["error"]["message"]
    r = post("load_lora_adapter", lora_name="bad")
    assert r.status_code == 400  # no path: a validation error
    with pytest.raises(openai.NotFoundError):
        _complete(server, "qv", "Hello")
    r = post("unload_lora_adapter", lora_name="qv")
    assert r.status_code == 404 and r.json()["error"]["code"] == "lora_not_found"
    # The freed slot takes a new adapter; the one loaded at start still serves.
    r = post("load_lora_adapter", lora_name="qv2", lora_path=str(adapter_dirs["qv"]))
    assert r.status_code == 200, r.text
    assert _complete(server, "qv2", PROMPTS[3]) == expected["qv"][3]
    assert _complete(server, "all", PROMPTS[3]) == expected["all"][3]


def test_runtime_updating_is_off_by_default(tiny_server: ServerProcess) -> None:
    r = httpx.post(f"{tiny_server.url}/v1/load_lora_adapter",
                   json={"lora_name": "a", "lora_path": "/tmp"}, timeout=10)  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["code"] == "lora_updating_disabled"
