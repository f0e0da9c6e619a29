"""The real all-MiniLM-L6-v2 through surge's BERT: equal to Hugging Face's BertModel with
sentence-transformers' mean pooling, whatever the batch, and meaningful."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surge.models.embedding import EmbeddingModel, read_pooling

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "Surge serves large language models to many users at once, and keeps serving them.",
]


@pytest.fixture(scope="module")
def model(minilm_path: Path) -> EmbeddingModel:
    return EmbeddingModel.load(minilm_path)


def test_the_folder_says_mean_pooling_normalized_256_tokens(minilm_path: Path) -> None:
    pooling = read_pooling(minilm_path, max_positions=512)
    assert (pooling.mode, pooling.normalize, pooling.max_seq_length) == ("mean", True, 256)


def test_tokens_are_bert_wordpieces_with_cls_and_sep(model: EmbeddingModel) -> None:
    ids = model.tokenize("Hello World")
    assert ids[0] == model.tokenizer.token_to_id("[CLS]")
    assert ids[-1] == model.tokenizer.token_to_id("[SEP]")
    assert model.tokenizer.decode(ids) == "hello world"  # the model is uncased
    assert len(model.tokenize("word " * 400)) == 402  # never silently truncated


@pytest.mark.slow
def test_vectors_equal_transformers_bert_with_mean_pooling(
    model: EmbeddingModel, minilm_path: Path
) -> None:
    from transformers import AutoModel, AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(minilm_path)
    hf = AutoModel.from_pretrained(minilm_path).eval()
    enc = hf_tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = hf(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    expected = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    lengths = enc["attention_mask"].sum(1).tolist()
    hf_ids = [ids[:n] for ids, n in zip(enc["input_ids"].tolist(), lengths, strict=True)]
    assert [model.tokenize(s) for s in SENTENCES] == hf_ids
    got = torch.tensor(model.embed([model.tokenize(s) for s in SENTENCES]))
    assert got.shape == (len(SENTENCES), 384)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_a_vector_does_not_depend_on_its_batch(model: EmbeddingModel) -> None:
    ids = [model.tokenize(s) for s in SENTENCES]
    alone = torch.tensor([model.embed([i])[0] for i in ids])
    together = torch.tensor(model.embed(ids))  # padded to the longest
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
    assert torch.allclose(together.norm(dim=-1), torch.ones(len(ids)), atol=1e-5)


def test_similar_sentences_are_near(model: EmbeddingModel) -> None:
    v = torch.tensor(model.embed([model.tokenize(s) for s in SENTENCES[:4]]))
    sim = v @ v.T
    assert sim[0, 1] > 0.6  # eating food / eating bread
    assert sim[0, 1] > sim[0, 2] + 0.5 and sim[0, 1] > sim[0, 3]
