"""/openapi.json tells the truth: schemathesis, a schema-driven fuzzer, sends valid and invalid
requests to every operation of a real `surge serve` (the tiny model) and checks each answer
against what the document declares.

Checks run: not_a_server_error (no 5xx), status_code_conformance (every status is declared),
content_type_conformance (JSON, SSE, Prometheus text as declared), response_schema_conformance
(bodies match the declared schemas: the OpenAI error object for every error),
response_headers_conformance. Not run: positive_data_acceptance, which expects a 2xx for any
schema-valid body, but a valid body still names a model or a stored response that isn't there
(404) or asks for more tokens than the context holds (400); negative_data_rejection, which
expects a 4xx for anything outside the schema, but a field the schema does not list is ignored
(as OpenAI's API does) rather than refused; the stateful phase (links between operations).

Bounded: the coverage phase (boundary and invalid values of every field) then the fuzzing phase
(5 examples an operation, repeated while time is left), 15 s in all (the suite's budget), a
fixed seed."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import ServerProcess

CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
)


@pytest.fixture(scope="module")
def fuzzed_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    """Its own server, its context short: a fuzzed request may ask for n=16 choices of as many
    tokens as fit, which must stay quick on a slow CPU."""
    server = ServerProcess(tiny_model_dir, "--dtype", "float32", "--max-model-len", "256",
                           "--request-timeout", "30")  # fmt: skip
    yield server
    server.stop()


def test_openapi_document_declares_what_the_server_answers(
    fuzzed_server: ServerProcess, tmp_path: Path
) -> None:
    url = fuzzed_server.url + "/openapi.json"
    doc = httpx.get(url, timeout=10).json()
    completions = doc["paths"]["/v1/completions"]["post"]["responses"]
    assert {"400", "401", "404", "413", "429", "503", "504"} <= completions.keys()
    assert "422" not in completions  # validation failures are 400s here
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    assert completions["429"]["content"]["application/json"]["schema"] == error_ref
    assert "text/event-stream" in completions["200"]["content"]
    assert doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"].keys() == {"text/plain"}

    cmd = [
        sys.executable, "-m", "schemathesis.cli", "run", url,
        "--checks", ",".join(CHECKS),
        "--phases", "examples,coverage,fuzzing",
        "--max-examples", "5",
        "--max-time", "15",
        "--seed", "34",
        "--workers", "2",
        "--request-timeout", "30",
        "--generation-database", "none",
        "--no-color",
    ]  # fmt: skip
    started = time.monotonic()
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    took_s = time.monotonic() - started
    (tmp_path / "schemathesis.log").write_text(out)
    assert run.returncode == 0, f"schemathesis failed after {took_s:.0f}s:\n{out[-8000:]}"
    assert "No issues found" in out or "passed" in out, out[-4000:]
