"""transformers models, unchanged, through build and load on the CPU: named inputs reach
forward by keyword, outputs keep their ModelOutput class, caches are refused with the fix,
integer ranges come from the embeddings, and the predictor equals transformers' own eager
forward on fresh inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from qkan_pack import ModelSourceError, Predictor, ShapeSpecError, build  # noqa: E402

from ..conftest import MODELS  # noqa: E402

HF = MODELS / "hf_models.py"
VOCAB = 100


def eager_model(arch: str, **config: object) -> torch.nn.Module:
    """transformers' own model with the artifact's weights: the reference on fresh inputs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_models_eager", HF)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module.build_model(arch, **config).eval()


def fresh(shape: tuple[int, ...], high: int, seed: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BERT with its inputs declared out of forward's order (token_type_ids first)."""
    shapes = [{"token_type_ids": (b, 16), "input_ids": (b, 16)} for b in (1, 4)]
    return build(HF, shapes, output=tmp_path_factory.mktemp("bert") / "bert", dtype="int64",
                 config={"arch": "bert"}).path


def test_named_inputs_reach_forward_by_keyword(bert: Path) -> None:
    """Declared out of order and passed by name: positional passing would read
    token_type_ids as attention_mask (logits off by ~1e-2, no error)."""
    reference = eager_model("bert")
    with Predictor.load(bert) as predictor:
        assert predictor.manifest.call == "keyword"
        for seed, batch in enumerate((1, 4, 1)):
            ids, types = fresh((batch, 16), VOCAB, seed), fresh((batch, 16), 2, 100 + seed)
            with torch.no_grad():
                want = reference(input_ids=ids, token_type_ids=types).logits
                wrong = reference(types, ids).logits  # what positional passing computed
            by_name = predictor(input_ids=ids, token_type_ids=types)
            in_order = predictor(types, ids)  # positionals follow the declared order
            torch.testing.assert_close(by_name.logits, want, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(in_order.logits, want, rtol=1e-5, atol=1e-6)
            assert (wrong - want).abs().max() > 1e-4


def test_outputs_keep_their_model_output_class(bert: Path) -> None:
    from transformers.modeling_outputs import SequenceClassifierOutput

    with Predictor.load(bert) as predictor:
        out = predictor(input_ids=fresh((1, 16), VOCAB, 1), token_type_ids=fresh((1, 16), 2, 2))
        assert type(out) is SequenceClassifierOutput
        assert out.logits.shape == (1, 3) and out["logits"] is out.logits
        assert out.to_tuple()[0] is out.logits
        assert "SequenceClassifierOutput" in predictor.manifest.shapes[0].outputs.label


def test_integer_ranges_come_from_the_embeddings(bert: Path) -> None:
    with Predictor.load(bert) as predictor:
        inputs = {d.name: d for d in predictor.manifest.inputs}
    assert (inputs["input_ids"].low, inputs["input_ids"].high) == (0, VOCAB)
    assert "word_embeddings" in inputs["input_ids"].range_source
    assert (inputs["token_type_ids"].low, inputs["token_type_ids"].high) == (0, 2)
    assert "token_type_embeddings" in inputs["token_type_ids"].range_source


def test_gpt2_with_attention_mask_and_no_cache(tmp_path: Path) -> None:
    shapes = [{"input_ids": (b, 12), "attention_mask": (b, 12)} for b in (1, 2)]
    with pytest.warns(UserWarning, match="attention_mask.*--input-range"):
        result = build(HF, shapes, output=tmp_path / "gpt2", dtype="int64",
                       config={"arch": "gpt2", "use_cache": False})
    assert any("attention_mask" in note for note in result.notes)
    reference = eager_model("gpt2", use_cache=False)
    with Predictor.load(result.path) as predictor:
        ids, mask = fresh((2, 12), VOCAB, 7), torch.ones(2, 12, dtype=torch.int64)
        mask[1, 8:] = 0  # a padded row: the mask must reach forward as the mask
        with torch.no_grad():
            want = reference(input_ids=ids, attention_mask=mask).logits
        got = predictor(input_ids=ids, attention_mask=mask)
        torch.testing.assert_close(got.logits, want, rtol=1e-5, atol=1e-5)


def test_a_cache_in_the_outputs_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match=r"Cache.*use_cache=false"):
        build(HF, [{"input_ids": (1, 8)}], output=tmp_path / "cached", dtype="int64",
              config={"arch": "gpt2", "use_cache": True})
    assert not (tmp_path / "cached").exists()


def test_encoder_decoder(tmp_path: Path) -> None:
    shapes = [{"input_ids": (b, 10), "attention_mask": (b, 10), "decoder_input_ids": (b, 6)}
              for b in (1, 2)]
    path = build(HF, shapes, output=tmp_path / "t5", dtype="int64", config={"arch": "t5"}).path
    reference = eager_model("t5")
    with Predictor.load(path) as predictor:
        ids, dec = fresh((2, 10), VOCAB, 3), fresh((2, 6), VOCAB, 4)
        mask = torch.ones(2, 10, dtype=torch.int64)
        with torch.no_grad():
            want = reference(input_ids=ids, attention_mask=mask, decoder_input_ids=dec)
        got = predictor(input_ids=ids, attention_mask=mask, decoder_input_ids=dec)
        assert type(got) is type(want)
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.encoder_last_hidden_state, want.encoder_last_hidden_state,
                                   rtol=1e-5, atol=1e-5)


def test_unknown_input_names_list_forward_parameters(tmp_path: Path) -> None:
    with pytest.raises(ShapeSpecError, match=r"\['input_idz'\].*takes: input_ids, attention_mask"):
        build(HF, [{"input_idz": (1, 8)}], output=tmp_path / "x", dtype="int64",
              config={"arch": "bert"})


def test_packages_the_model_imports_are_recorded(bert: Path) -> None:
    with Predictor.load(bert) as predictor:
        assert predictor.manifest.model.packages["transformers"] == transformers.__version__


def test_bart_positions_are_not_mistaken_for_token_ranges(tmp_path: Path) -> None:
    """BART's learned positional embedding receives decoder_input_ids only for its shape:
    the range comes from the table the ids index (the vocabulary), not from it."""
    from transformers import BartConfig, BartForConditionalGeneration  # noqa: F401

    model = tmp_path / "bart_model.py"
    model.write_text(
        "import torch\nfrom transformers import BartConfig, BartForConditionalGeneration\n\n"
        "def build_model():\n    torch.manual_seed(0)\n"
        "    return BartForConditionalGeneration(BartConfig(vocab_size=100, d_model=32, "
        "encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,"
        " encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64, use_cache=False))\n")
    shapes = [{"input_ids": (1, 8), "decoder_input_ids": (1, 5)}]
    manifest = build(model, shapes, output=tmp_path / "bart", dtype="int64").manifest
    ranges = {d.name: (d.low, d.high) for d in manifest.inputs}
    assert ranges == {"input_ids": (0, VOCAB), "decoder_input_ids": (0, VOCAB)}
