"""EngineCore.step in process on the tiny random Llama, without a server or LLM.generate: abort in
the middle of a chunked prefill, preemption by recompute, n > 1 rows sharing the prompt's blocks,
structured output and LoRA rows. Each case checks tokens and finish reasons against the same
request run alone (greedy, or seeded: a seeded row's noise depends on its seed and step only), and
the block manager's own counts."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from surge.engine.client.outputs import EngineCoreRequest, FinishReason
from surge.engine.config import CacheConfig, EngineConfig, LoRAConfig, ModelConfig, SchedulerConfig
from surge.engine.core.engine_core import EngineCore
from surge.sampling_params import SamplingParams
from surge.structured_output import StructuredOutput
from tests.lora_adapters import write_peft_adapter

BLOCK = 4  # small blocks: a few dozen tokens span many of them
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def make_engine(
    model_dir: Path,
    *,
    num_blocks: int = 256,
    budget: int = 512,
    prefix_caching: bool = True,
    adapters: tuple[tuple[str, str], ...] = (),
) -> EngineCore:
    return EngineCore(
        EngineConfig(
            ModelConfig(model=str(model_dir), dtype="float32"),
            CacheConfig(block_size=BLOCK, num_blocks=num_blocks,
                        enable_prefix_caching=prefix_caching),
            SchedulerConfig(max_num_batched_tokens=budget),
            LoRAConfig(adapters=adapters),
        )
    )  # fmt: skip


def prompt(start: int, length: int) -> list[int]:
    """Plain token ids (no tokenizer): distinct prompts for distinct `start`s."""
    return [100 + (start * 37 + i * 11) % 5000 for i in range(length)]


def req(
    req_id: str, ids: list[int], params: SamplingParams = GREEDY, **kw: object
) -> EngineCoreRequest:
    return EngineCoreRequest(req_id, ids, params, **kw)  # type: ignore[arg-type]


@dataclass
class Result:
    tokens: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    num_outputs: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0


def drain(engine: EngineCore, results: dict[str, Result] | None = None) -> dict[str, Result]:
    """Step until the engine is idle, collecting every request's outputs; the block manager's
    bookkeeping is checked after every step."""
    results = {} if results is None else results
    for _ in range(10_000):  # bounded: a scheduler bug must fail, not hang
        if not engine.has_work():
            break
        step(engine, results)
    assert not engine.has_work()
    return results


def step(engine: EngineCore, results: dict[str, Result]) -> None:
    for out in engine.step():
        r = results.setdefault(out.req_id, Result())
        assert r.finish is None, f"{out.req_id}: output after its finish"
        r.tokens += out.new_token_ids
        r.finish = out.finish_reason
        r.num_outputs += 1
        r.num_cached_tokens = out.num_cached_tokens
        r.num_preemptions = max(r.num_preemptions, out.num_preemptions)
    engine.blocks.check_invariants()


def alone(engine: EngineCore, creq: EngineCoreRequest) -> Result:
    """`creq` run by itself on an idle engine."""
    assert not engine.has_work()
    engine.add_request(creq)
    return drain(engine)[creq.req_id]


def blocks_in_use(engine: EngineCore) -> int:
    return engine.blocks.num_blocks - engine.blocks.num_free_blocks


# ---- abort mid-prefill ------------------------------------------------------------------------
def test_abort_mid_prefill_frees_its_blocks_and_spares_the_others(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, budget=8)
    short, long = prompt(1, 3), prompt(2, 40)
    ref_short = alone(engine, req("ref-short", short))
    ref_long = alone(engine, req("ref-long", long))
    engine.blocks.reset_prefix_cache()  # nothing cached: the run below computes every block

    engine.add_request(req("short", short))
    engine.add_request(req("long", long))
    results: dict[str, Result] = {}
    step(engine, results)  # short's whole prompt (3) and long's first chunk (the 5 left)
    assert set(results) == {"short"}  # long is mid-prefill: nothing sampled for it yet
    assert engine.scheduler.requests["long"].num_computed_tokens == 5
    assert len(engine.blocks.block_table("long")) == 2  # ceil(5 / 4)
    short_blocks = len(engine.blocks.block_table("short"))
    assert blocks_in_use(engine) == short_blocks + 2

    assert engine.abort("long")
    assert not engine.blocks.has("long")
    assert blocks_in_use(engine) == short_blocks  # long's blocks are free again
    assert not engine.abort("long")  # once only
    drain(engine, results)
    assert set(results) == {"short"}  # no output for the aborted request, ever
    assert results["short"].tokens == ref_short.tokens
    assert results["short"].finish is FinishReason.LENGTH
    assert blocks_in_use(engine) == 0

    # The chunk's one full block stayed in the prefix cache, and the computed start of its
    # second (one token) stayed for partial reuse; they hold the right K/V: the request run
    # again from them gives what it gives from scratch.
    again = alone(engine, req("long-again", long))
    assert again.num_cached_tokens == 5
    assert again.tokens == ref_long.tokens


# ---- preemption -------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no-prefix-cache", "prefix-cache"])
def test_preempted_requests_resume_with_the_tokens_they_get_alone(
    tiny_model_dir: Path, prefix_caching: bool
) -> None:
    # Each request needs ceil((10 + 20) / 4) = 8 blocks; three of them cannot share 16.
    engine = make_engine(tiny_model_dir, num_blocks=16, prefix_caching=prefix_caching)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    prompts = {f"r{i}": prompt(10 + i, 10) for i in range(3)}
    refs = {k: alone(engine, req(f"ref-{k}", ids, params)) for k, ids in prompts.items()}
    assert all(r.num_preemptions == 0 for r in refs.values())

    for k, ids in prompts.items():
        engine.add_request(req(k, ids, params))
    before = engine.stats().scheduler.num_preemptions
    results = drain(engine)
    assert engine.stats().scheduler.num_preemptions > before  # the small pool really forced it
    assert any(results[k].num_preemptions > 0 for k in prompts)
    for k in prompts:
        assert results[k].tokens == refs[k].tokens, k
        assert results[k].finish is FinishReason.LENGTH
        assert len(results[k].tokens) == 20
    assert blocks_in_use(engine) == 0


# ---- n > 1 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix_caching", [False, True], ids=["fork", "prefix-cache"])
def test_parallel_samples_share_the_prompt_blocks(
    tiny_model_dir: Path, prefix_caching: bool
) -> None:
    engine = make_engine(tiny_model_dir, prefix_caching=prefix_caching)
    ids = prompt(20, 18)  # 4 full blocks of prompt, the 18th token computed by each row
    shared = (len(ids) - 1) // BLOCK
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, n=3, seed=5)
    rows = [f"p#{k}" for k in range(3)]  # as OutputProcessor fans n out
    for k, row in enumerate(rows):
        engine.add_request(req(row, ids, params, seed=5 + k,
                               share_prompt_with=None if k == 0 else rows[0]))  # fmt: skip
    results: dict[str, Result] = {}
    step(engine, results)  # the first row's prefill; the others wait for its blocks
    assert set(results) == {rows[0]}
    step(engine, results)
    tables = [engine.blocks.block_table(r) for r in rows]
    assert tables[1][:shared] == tables[0][:shared] == tables[2][:shared]
    # Past the shared prefix every row has blocks of its own.
    tails = [set(t[shared:]) for t in tables]
    assert not (tails[0] & tails[1]) and not (tails[0] & tails[2]) and not (tails[1] & tails[2])
    assert blocks_in_use(engine) == shared + sum(len(t) for t in tails)
    drain(engine, results)
    assert [results[r].num_cached_tokens for r in rows] == [0, shared * BLOCK, shared * BLOCK]

    # Each row is what its seed gives alone; the seeds make them differ.
    for k, row in enumerate(rows):
        ref = alone(engine, req(f"ref-{k}", ids, params, seed=5 + k))
        assert results[row].tokens == ref.tokens, row
        assert results[row].finish is FinishReason.LENGTH
    assert len({tuple(results[r].tokens) for r in rows}) == 3
    assert blocks_in_use(engine) == 0


# ---- structured output ------------------------------------------------------------------------
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_rows_parse_beside_free_rows(tiny_model_dir: Path, temperature: float) -> None:
    engine = make_engine(tiny_model_dir, budget=16)  # chunked prompts under the grammar, too
    structured = SamplingParams(temperature=temperature, max_tokens=120, seed=3,
                                structured=StructuredOutput.json_schema(SCHEMA))  # fmt: skip
    free = prompt(31, 20)
    ref_free = alone(engine, req("ref-free", free))
    for i in range(3):
        engine.add_request(req(f"json{i}", prompt(40 + i, 6 + 7 * i), structured))
    engine.add_request(req("free", free))
    results = drain(engine)
    for i in range(3):
        r = results[f"json{i}"]
        value = json.loads(engine.tokenizer.decode(r.tokens))  # whole: it ended with the grammar
        assert set(value) == {"name", "age"}
        assert isinstance(value["name"], str) and len(value["name"]) <= 8
        assert isinstance(value["age"], int) and 0 <= value["age"] <= 120
        assert r.finish is FinishReason.STOP
        assert len(r.tokens) < 120
    # The grammar's mask touches its own rows only.
    assert results["free"].tokens == ref_free.tokens
    assert blocks_in_use(engine) == 0


# ---- LoRA rows --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_peft_adapter(tiny_model_dir, tmp_path_factory.mktemp("lora") / "a", seed=1)


def test_lora_rows_in_a_mixed_batch_get_what_they_get_alone(
    tiny_model_dir: Path, adapter: Path
) -> None:
    engine = make_engine(tiny_model_dir, budget=24, adapters=(("a", str(adapter)),))
    prompts = [prompt(50, 9), prompt(51, 22)]
    rows = [(f"{lora or 'base'}{i}", ids, lora) for i, ids in enumerate(prompts)
            for lora in (None, "a")]  # fmt: skip
    refs = {
        name: alone(engine, req(f"ref-{name}", ids, lora_name=lora)) for name, ids, lora in rows
    }
    # The adapter really changes the output, so the comparisons below can fail.
    assert refs["base0"].tokens != refs["a0"].tokens
    assert refs["base1"].tokens != refs["a1"].tokens

    engine.blocks.reset_prefix_cache()
    for name, ids, lora in rows:
        engine.add_request(req(name, ids, lora_name=lora))
    assert engine.stats().lora_waiting == ("a",)
    results = drain(engine)
    for name, _, _ in rows:
        assert results[name].tokens == refs[name].tokens, name
        assert results[name].finish is FinishReason.LENGTH

    # The adapter salts the prefix cache: base and adapter K/V of one prompt are never mixed.
    engine.blocks.reset_prefix_cache()
    assert alone(engine, req("x-base", prompts[1])).num_cached_tokens == 0
    assert alone(engine, req("x-a", prompts[1], lora_name="a")).num_cached_tokens == 0
    # All but the last token (full blocks, then the start of the next one copied).
    cached = len(prompts[1]) - 1
    assert alone(engine, req("y-a", prompts[1], lora_name="a")).num_cached_tokens == cached
    assert alone(engine, req("y-base", prompts[1])).num_cached_tokens == cached
    assert blocks_in_use(engine) == 0
