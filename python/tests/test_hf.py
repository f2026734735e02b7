"""ringattn.hf: attn_implementation="ringattn" in Hugging Face Transformers models (tiny random configs, no
download) gives the logits and every parameter's gradient of the same model in f64 with Transformers' own
"eager" attention (its dense masks and softmax), on CPU: Llama (GQA, padding, packed sequences by
position_ids and by cu_seq_lens), Gemma 2 (soft cap, sliding window), gpt-oss (sinks, sliding window),
ModernBERT (bidirectional sliding window), a mask pattern ringattn builds densely, dropout; and decoding
with dynamic and static KV caches (decoders, and encoder-decoders' cross-attention: Bart, T5); other
decoder families (Mistral, Qwen2, Gemma 3, Cohere 2, Phi-3); torch.compile of a training step in one
graph. Skipped where PyTorch or Transformers is not installed."""

import copy
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (CI installs none; run on a machine with it)")
transformers = pytest.importorskip("transformers", reason="Transformers is not installed")

import ringattn.hf  # noqa: E402
from test_torch import close  # noqa: E402

NAME = ringattn.hf.register()


def _eager_mask_of_f32_range(*args, dtype=None, **kwargs):
    """Transformers' eager mask with float32's min where masked, for the f64 twin: eager's softmax runs in
    float32, where float64's min becomes -inf and a fully masked row (a left-padded query) NaN."""
    return _eager_mask(*args, dtype=torch.float32, **kwargs)


_eager_mask = transformers.masking_utils.eager_mask
transformers.masking_utils.AttentionMaskInterface.register("eager", _eager_mask_of_f32_range)
TOL = 5e-5  # f32 kernels through a model against its f64 eager twin, relative to the largest entry


def twins(config_class, **fields):
    """A tiny random model on ringattn (f32) and its f64 twin on Transformers' eager attention."""
    torch.manual_seed(0)
    config = config_class(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                          **fields)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config)
    reference = copy.deepcopy(model).double()
    model.set_attn_implementation(NAME)
    return model, reference


def loss_of(model, weights, valid=None, **inputs):
    logits = model(**inputs).logits
    loss = (logits * weights.to(logits.dtype)).sum(-1)
    return logits, (loss if valid is None else loss * valid).sum()


def check_twins(model, reference, input_ids, valid=None, tol=TOL, **inputs):
    """Logits (at valid positions) and every parameter's gradient of model against its f64 twin (no KV
    cache, as in training: Transformers' eager masks read packed sequences from position_ids only then)."""
    inputs = dict(inputs, use_cache=False)
    weights = torch.randn(*input_ids.shape, model.config.vocab_size, generator=torch.Generator().manual_seed(5))
    got, loss = loss_of(model, weights, valid, input_ids=input_ids, **inputs)
    want, ref_loss = loss_of(reference, weights, valid, input_ids=input_ids, **inputs)
    loss.backward()
    ref_loss.backward()
    keep = (slice(None),) if valid is None else valid.bool()
    close(got[keep], want[keep], tol)
    for (name, p), (_, r) in zip(model.named_parameters(), reference.named_parameters()):
        assert p.grad is not None, name
        close(p.grad, r.grad, tol)


def check_generation(model, reference, prompt, **options):
    """Greedy decoding of model against its f64 twin: each step's logits, and the tokens."""
    options = dict(options, do_sample=False, output_logits=True, return_dict_in_generate=True)
    got, want = model.generate(prompt, **options), reference.generate(prompt, **options)
    for a, b in zip(got.logits, want.logits):
        close(a, b, TOL)
    assert torch.equal(got.sequences, want.sequences)


def ids(B, T, seed=1):
    return torch.randint(0, 101, (B, T), generator=torch.Generator().manual_seed(seed))


def test_llama_causal_gqa():
    model, reference = twins(transformers.LlamaConfig)
    check_twins(model, reference, ids(2, 37))


def test_llama_padding_right_and_left():
    model, reference = twins(transformers.LlamaConfig)
    mask = torch.ones(3, 29, dtype=torch.long)
    mask[0, 21:] = 0  # right padding
    mask[1, :6] = 0   # left padding
    check_twins(model, reference, ids(3, 29), valid=mask, attention_mask=mask)


def test_llama_packed_sequences_by_position_ids():
    model, reference = twins(transformers.LlamaConfig)
    positions = torch.cat([torch.arange(n) for n in (11, 1, 20, 9)])[None].repeat(2, 1)
    positions[1] = torch.cat([torch.arange(n) for n in (25, 16)])  # another cut in the second row
    check_twins(model, reference, ids(2, 41), position_ids=positions)


def test_padding_and_packing_under_inference_mode():
    """Tensors made under torch.inference_mode count no writes (their version cannot be read): the mask and
    position_ids read once a forward are read in every layer instead, with the same logits."""
    model, reference = twins(transformers.LlamaConfig)
    positions = torch.cat([torch.arange(n) for n in (11, 1, 20, 9)])[None]
    with torch.inference_mode():
        mask = torch.ones(2, 29, dtype=torch.long)
        mask[0, 21:] = 0
        for inputs, valid in ((dict(input_ids=ids(2, 29), attention_mask=mask), mask.bool()),
                              (dict(input_ids=ids(1, 41), position_ids=positions.clone()), None)):
            got = model(**inputs, use_cache=False).logits
            want = reference(**inputs, use_cache=False).logits
            keep = (slice(None),) if valid is None else valid
            close(got[keep], want[keep], TOL)


def test_llama_packed_sequences_by_cu_seq_lens():
    """FlashAttention's packed kwargs (DataCollatorWithFlattening's): eager reads position_ids, ringattn the
    cumulative lengths: the same sequences."""
    model, reference = twins(transformers.LlamaConfig)
    lengths = (7, 13, 1, 10)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    cu = torch.tensor([0, 7, 20, 21, 31], dtype=torch.int32)
    check_twins(model, reference, ids(1, 31), position_ids=positions, cu_seq_lens_q=cu, cu_seq_lens_k=cu)


GEMMA2 = dict(sliding_window=8, attn_logit_softcapping=5.0, final_logit_softcapping=30.0, query_pre_attn_scalar=16,
              layer_types=["sliding_attention", "full_attention"])
GPT_OSS = dict(sliding_window=6, num_local_experts=2, num_experts_per_tok=1, experts_implementation="eager",
               layer_types=["sliding_attention", "full_attention"])


def test_packing_and_padding_are_read_once_a_forward(monkeypatch):
    """Reading position_ids or a mask is a device sync: the first layer of a forward reads them, the others
    take its result; position_ids changed in place are read again."""
    model, _ = twins(transformers.LlamaConfig)
    reads = []
    read_positions, read_padding = ringattn.hf.sequence_ids_of_positions, ringattn.hf._padding_ids_of.fn
    monkeypatch.setattr(ringattn.hf, "sequence_ids_of_positions", lambda *a: reads.append("p") or read_positions(*a))
    monkeypatch.setattr(ringattn.hf._padding_ids_of, "fn", lambda *a: reads.append("m") or read_padding(*a))
    positions = torch.cat([torch.arange(n) for n in (9, 12)])[None]
    packed = model(input_ids=ids(1, 21), position_ids=positions, use_cache=False).logits
    assert reads == ["p"]
    positions[0, 9:] += 9  # one sequence now
    whole = model(input_ids=ids(1, 21), position_ids=positions, use_cache=False).logits
    assert reads == ["p", "p"] and not torch.allclose(packed, whole)
    mask = torch.ones(2, 21, dtype=torch.long)
    mask[0, 17:] = 0
    model(input_ids=ids(2, 21), attention_mask=mask, use_cache=False)
    assert reads == ["p", "p", "m"]


# Tracing reads the mask functions' closures, which torch.compile takes from PyTorch 2.15 (setup.sh's); older
# ones break the graph at the model's mask (correct, and checked on the GPU with PyTorch 2.11).
FULLGRAPH = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 15)


@pytest.mark.skipif(not FULLGRAPH, reason="torch.compile traces closures from PyTorch 2.15")
@pytest.mark.parametrize("case", ["llama_packed", "llama_padded", "gemma2_padded"])
def test_torch_compile_traces_the_model_in_one_graph(case):
    """torch.compile(fullgraph=True) of a training step: the hook reads no tensor while tracing (packing and
    padding go to the kernels as segment ids, the mask patterns are told apart by their code's names), and the
    compiled model's logits and gradients are the f64 eager twin's."""
    family, inputs = case.split("_")
    model, reference = twins(transformers.LlamaConfig) if family == "llama" else twins(transformers.Gemma2Config,
                                                                                           **GEMMA2)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    if inputs == "packed":
        positions = torch.cat([torch.arange(n) for n in (11, 1, 20)])[None].repeat(2, 1)
        check_twins(compiled, reference, ids(2, 32), position_ids=positions)
    else:
        mask = torch.ones(2, 32, dtype=torch.long)
        mask[0, 25:] = 0
        check_twins(compiled, reference, ids(2, 32), valid=mask, attention_mask=mask)


def test_gemma2_soft_cap_and_sliding_window():
    model, reference = twins(transformers.Gemma2Config, **GEMMA2)
    mask = torch.ones(2, 31, dtype=torch.long)
    mask[1, 25:] = 0
    check_twins(model, reference, ids(2, 31), valid=mask, attention_mask=mask)


def gpt_oss_twins():
    model, reference = twins(transformers.GptOssConfig, **GPT_OSS)
    with torch.no_grad():
        for layer in list(model.model.layers) + list(reference.model.layers):
            layer.self_attn.sinks.copy_(torch.linspace(-1.0, 2.0, 4))  # sinks that matter
    return model, reference


def test_gpt_oss_sinks_and_sliding_window():
    model, reference = gpt_oss_twins()
    check_twins(model, reference, ids(2, 27))
    assert model.model.layers[0].self_attn.sinks.grad.abs().max() > 0


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt_oss"])
def test_generation_with_a_kv_cache(family, cache):
    """Greedy decoding: each step's logits and the tokens equal the f64 eager twin's. A static cache hands
    the attention every slot, written or not (the written ones then a mask's columns); the prompts are
    shorter and longer than the sliding windows, one row left-padded."""
    model, reference = {"llama": lambda: twins(transformers.LlamaConfig),
                        "gemma2": lambda: twins(transformers.Gemma2Config, **GEMMA2),
                        "gpt_oss": gpt_oss_twins}[family]()
    model.eval(), reference.eval()
    for length in (4, 13):
        prompt, mask = ids(2, length), torch.ones(2, length, dtype=torch.long)
        mask[1, :2] = 0
        check_generation(model, reference, prompt, attention_mask=mask, max_new_tokens=9, pad_token_id=0,
                         cache_implementation=cache)


@pytest.mark.parametrize("family, fields", [
    ("mistral", dict(sliding_window=6)),
    ("qwen2", dict(use_sliding_window=True, sliding_window=6, max_window_layers=1)),
    ("gemma3_text", dict(sliding_window=6, layer_types=["sliding_attention", "full_attention"],
                         query_pre_attn_scalar=16)),
    ("cohere2", dict(sliding_window=6, layer_types=["sliding_attention", "full_attention"])),
    ("phi3", dict(pad_token_id=0)),
])
def test_other_decoder_families(family, fields):
    """Other models' attention modules on the hook (their windows, hybrid layers and scalings), by their
    configs' own defaults: padded training logits and gradients, then greedy decoding with a static cache."""
    pytest.importorskip("transformers.models." + family.replace("_text", ""), reason="a trimmed Transformers")
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(family, vocab_size=101, hidden_size=64, intermediate_size=96,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               head_dim=16, max_position_embeddings=256, **fields)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).eval()  # (eval: no dropout in either)
    reference = copy.deepcopy(model).double()
    model.set_attn_implementation(NAME)
    mask = torch.ones(2, 23, dtype=torch.long)
    mask[1, :5] = 0
    check_twins(model, reference, ids(2, 23), valid=mask, attention_mask=mask)
    check_generation(model, reference, ids(2, 23), attention_mask=mask, max_new_tokens=6, pad_token_id=0,
                     cache_implementation="static")


def seq2seq_twins(family):
    torch.manual_seed(0)
    config = {"bart": lambda: transformers.BartConfig(
                  vocab_size=101, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, max_position_embeddings=256,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, forced_eos_token_id=None),
              "t5": lambda: transformers.T5Config(vocab_size=101, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4,
                                                  pad_token_id=0, eos_token_id=2, decoder_start_token_id=0)}[family]()
    config._attn_implementation = "eager"
    model = transformers.AutoModelForSeq2SeqLM.from_config(config).eval()
    reference = copy.deepcopy(model).double()
    model.set_attn_implementation(NAME)
    return model, reference


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", ["bart", "t5"])
def test_encoder_decoder_generation(family, cache, padded):
    """Cross-attention's keys are the encoder's, every one of them (with or without its padding mask),
    beside the decoder's causal cache; T5's relative position bias is the attention's bias."""
    model, reference = seq2seq_twins(family)
    prompt, mask = ids(2, 11), torch.ones(2, 11, dtype=torch.long)
    mask[1, 8:] = 0
    check_generation(model, reference, prompt, attention_mask=mask if padded else None, max_new_tokens=7,
                     min_new_tokens=7, cache_implementation=cache)


def test_modernbert_bidirectional_sliding_window():
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                           num_attention_heads=4, local_attention=8, global_attn_every_n_layers=2,
                                           max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
                                           eos_token_id=2, cls_token_id=1, sep_token_id=2)
    config._attn_implementation = "eager"
    model = transformers.ModernBertModel(config)
    reference = copy.deepcopy(model).double()
    model.set_attn_implementation(NAME)
    mask = torch.ones(2, 33, dtype=torch.long)
    mask[0, 27:] = 0
    x = ids(2, 33)
    got = model(input_ids=x, attention_mask=mask).last_hidden_state
    want = reference(input_ids=x, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    close(got[keep], want[keep])
    (got[keep].sum()).backward()
    (want[keep].sum()).backward()
    for (name, p), (_, r) in zip(model.named_parameters(), reference.named_parameters()):
        if r.grad is not None:
            close(p.grad, r.grad)


def test_a_pattern_beyond_the_compact_ones_runs_as_its_dense_mask():
    """An or_mask overlay (as vision-language models add for image tokens): the mask function builds
    Transformers' exact boolean mask, with a warning, and the attention equals eager's under it."""
    from transformers.masking_utils import create_causal_mask

    model, reference = twins(transformers.LlamaConfig)
    embeds = torch.zeros(2, 19, 64)

    def image_block(batch_idx, head_idx, q_idx, kv_idx):  # tokens 4 .. 9 see each other both ways
        return (q_idx >= 4) & (q_idx < 10) & (kv_idx >= 4) & (kv_idx < 10)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ringattn.hf._warned.discard("dense")
        mask = create_causal_mask(model.config, embeds, None, None, torch.arange(19)[None],
                                  or_mask_function=image_block)
    assert any("dense" in str(w.message) for w in caught)
    assert mask.dtype == torch.bool and mask.shape == (2, 1, 19, 19) and bool(mask[0, 0, 4, 9])
    want_mask = create_causal_mask(reference.config, embeds.double(), None, None, torch.arange(19)[None],
                                   or_mask_function=image_block)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, 19, 16, generator=g) for h in (4, 2, 2))
    layer, ref_layer = model.model.layers[0].self_attn, reference.model.layers[0].self_attn
    got, _ = ringattn.hf.attention_forward(layer, q, k, v, mask, scaling=0.25)
    from transformers.models.llama.modeling_llama import eager_attention_forward
    want, _ = eager_attention_forward(ref_layer, q.double(), k.double(), v.double(), want_mask, scaling=0.25)
    close(got, want)


def test_dropout_is_reproducible_and_differentiable():
    model, _ = twins(transformers.LlamaConfig, attention_dropout=0.3)
    model.train()
    x = ids(1, 23)
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        model.zero_grad()
        logits = model(input_ids=x).logits
        logits.sum().backward()
        runs.append((logits.detach(), model.model.layers[0].self_attn.q_proj.weight.grad.clone()))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    model.eval()
    assert not torch.allclose(model(input_ids=x).logits, runs[0][0])


def test_gradient_checkpointing_recomputes_the_same_dropout():
    """Checkpointing restores the generator before recomputing a layer: the seed drawn again is the same,
    so the gradients equal those without checkpointing."""
    model, _ = twins(transformers.LlamaConfig, attention_dropout=0.3)
    model.train()
    x = ids(2, 19)
    grads = []
    for checkpointing in (False, True):
        if checkpointing:
            model.gradient_checkpointing_enable()
        model.zero_grad()
        torch.manual_seed(3)
        model(input_ids=x, use_cache=False).logits.sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for got, want in zip(*grads):
        close(got, want, 1e-6)


def test_register_refuses_options_of_the_other_kind():
    with pytest.raises(ValueError, match="layout"):
        ringattn.hf.register("x", layout="zigzag")
    with pytest.raises(ValueError, match="timeout"):
        ringattn.hf.register("x", timeout=5.0)
    with pytest.raises(ValueError, match="impl applies"):
        ringattn.hf.register("x", ring=True, impl="sdpa")
    with pytest.raises(ValueError, match="reserves"):
        ringattn.hf.register("ringattn_flash")
    with pytest.raises(Exception, match="layout"):
        ringattn.hf.register("x", ring=True, layout="zagzig")


def test_bad_cu_seq_lens_and_masks_are_named():
    model, _ = twins(transformers.LlamaConfig)
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        model(input_ids=ids(1, 10), cu_seq_lens_q=torch.tensor([0, 4, 9]), cu_seq_lens_k=torch.tensor([0, 4, 9]))
    with pytest.raises(ValueError, match="one row"):
        model(input_ids=ids(2, 10), cu_seq_lens_q=torch.tensor([0, 10]), cu_seq_lens_k=torch.tensor([0, 10]))
