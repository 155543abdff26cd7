"""patch() on tiny Hugging Face transformers models of each supported
architecture (random weights from their config classes, nothing
downloaded): the same loss, gradients, state_dict and generation as the
unpatched model, with fastreduce's operators doing the work."""

import copy

import pytest
import torch

import fastreduce_torch as fr
from fastreduce_torch.lazy_logits import LazyLogits
from conftest import DEVICES, error_vs_reference

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 8}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 8}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 8}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", {"head_dim": 8, "num_local_experts": 4,
                                                      "num_experts_per_tok": 2, "sliding_window": 8}),
    "gemma3n": ("Gemma3nTextConfig", "Gemma3nForCausalLM", {"head_dim": 8, "laurel_rank": 4, "altup_num_inputs": 2,
                                                            "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 97,
                                                            "num_kv_shared_layers": 0}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {}),
    # logits scaled before the loss: Cohere multiplies, Granite divides
    "cohere": ("CohereConfig", "CohereForCausalLM", {"logit_scale": 0.3}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {"logits_scaling": 3.0}),
}


def build(name, device, dtype=torch.float32):
    config_name, model_name, extra = ARCHITECTURES[name]
    if not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    if name == "gpt2":
        config = transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    else:
        config = getattr(transformers, config_name)(**SMALL, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).to(device=device, dtype=dtype)
    for p in model.parameters():  # Gemma's norms start at zero: make every weight matter
        p.data.add_(0.1 * torch.randn_like(p))
    return model.eval()


def norm_layers(model) -> int:
    return sum(1 for m in model.modules()
               if type(m).__name__.endswith(("RMSNorm", "LayerNorm")) or type(m) is torch.nn.LayerNorm)


def batch(device):
    ids = torch.randint(0, 97, (2, 11), device=device)
    labels = ids.clone()
    labels[0, :3] = -100
    return ids, labels


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_patched_model_trains_as_unpatched(name, device):
    model = build(name, device)
    ours = copy.deepcopy(model)
    count = fr.patch(ours)
    assert count == norm_layers(model) > 0
    state, patched_state = model.state_dict(), ours.state_dict()
    assert list(state) == list(patched_state)
    assert all(torch.equal(state[k], patched_state[k]) for k in state)

    ids, labels = batch(device)
    expected = model(input_ids=ids, labels=labels)
    with torch.profiler.profile() as prof:
        got = ours(input_ids=ids, labels=labels)
    names = {e.name for e in prof.events()}
    assert "fastreduce::fused_linear_cross_entropy" in names
    assert {"fastreduce::rms_norm", "fastreduce::layer_norm"} & names
    assert got.logits is None  # no logits were made
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=0)
    expected.loss.backward()
    got.loss.backward()
    for (key, p), q in zip(model.named_parameters(), ours.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-4 * p.grad.abs().max().item(), msg=key)

    with torch.no_grad():  # without labels: the logits, as before
        torch.testing.assert_close(ours(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    prompt = ids[:, :4]
    generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False,
                               pad_token_id=0)
    assert torch.equal(ours.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6,
                                     do_sample=False, pad_token_id=0), generated)


@pytest.mark.parametrize("device", DEVICES)
def test_gemma_norm_rounds_once_as_transformers(device):
    # Gemma's `1 + weight` in float32 beside bfloat16 activations: applied as
    # float32 (rounded to bfloat16 first, a quarter of the outputs were a
    # unit off), so the patched norm's output is transformers' up to the
    # float32 sums' order: at most a unit in the last place, and rarely.
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    torch.manual_seed(0)
    norm = GemmaRMSNorm(1024).to(device=device, dtype=torch.bfloat16)
    norm.weight.data.normal_(0, 0.3)
    x = torch.randn(64, 1024, device=device, dtype=torch.bfloat16) * 3
    expected = norm(x)
    patched = torch.nn.Sequential(copy.deepcopy(norm))
    assert fr.patch(patched) == 1
    got = patched(x)
    assert got.dtype == expected.dtype
    ulp = torch.exp2(torch.floor(torch.log2(expected.float().abs().clamp_min(1e-30))) - 7)
    differ = got != expected
    assert ((got.float() - expected.float()).abs() <= ulp).all()
    assert differ.float().mean().item() < 0.01


def model_classes(suffixes):
    """The classes named ``*suffix`` defined by the models of the installed transformers."""
    import importlib
    import pkgutil

    found = []
    for info in pkgutil.iter_modules(transformers.models.__path__):
        try:
            module = importlib.import_module(f"transformers.models.{info.name}.modeling_{info.name}")
        except Exception:  # a model whose optional dependencies are missing
            continue
        found += [cls for name, cls in vars(module).items()
                  if isinstance(cls, type) and name.endswith(suffixes) and cls.__module__ == module.__name__]
    return found


@pytest.fixture(scope="module")
def norm_classes():
    """Every RMSNorm or LayerNorm class of transformers (not torch.nn.LayerNorm's
    subclasses: patch() swaps those by type)."""
    return [cls for cls in model_classes(("RMSNorm", "LayerNorm")) if not issubclass(cls, torch.nn.LayerNorm)]


def make_norm(cls, width):
    """An instance with random parameters; None where the constructor wants
    more than a width (or nothing: the unweighted norms take eps first)."""
    import inspect

    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
    try:
        norm = cls() if params and params[0].name == "eps" else cls(width)
    except TypeError:
        return None
    for p in norm.parameters():
        p.data.normal_(0.5, 0.5)
    return norm


# (input dtype, parameter dtype): a model cast to one dtype, and bfloat16 /
# float16 activations beside float32 parameters (mixed precision).
NORM_DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
               (torch.float16, torch.float32)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtypes", NORM_DTYPES, ids=lambda d: f"{d[0]}-{d[1]}".replace("torch.", ""))
def test_every_recognised_norm_class_computes_as_transformers(norm_classes, dtypes, device):
    # Each class patch() swaps, against its own forward and backward: two-byte
    # outputs at most a unit in the last place apart (the cast-then-weight
    # form rounds once where transformers rounds twice), float32 ones within
    # the sums' order, gradients within the rounding of the input dtype.
    from fastreduce_torch import hf

    dtype, param_dtype = dtypes
    swapped = [cls for cls in norm_classes if hf._fused_norm_class(cls) is not None]
    rms = [cls for cls in norm_classes if cls.__name__.endswith("RMSNorm")]
    assert len(set(swapped) & set(rms)) >= 0.8 * len(rms), [c.__name__ for c in rms if c not in swapped]
    assert {"T5LayerNorm", "CohereLayerNorm", "LlamaRMSNorm", "GemmaRMSNorm"} <= {c.__name__ for c in swapped}
    checked = 0
    for cls in swapped:
        norm = make_norm(cls, 48)
        if norm is None:
            continue
        norm = norm.to(device=device, dtype=param_dtype)
        ours = copy.deepcopy(norm)
        assert hf.patch_norm(ours) and isinstance(ours, cls)
        x = (torch.randn(3, 5, 48, device=device) * 4).to(dtype).requires_grad_()
        x_ours = x.detach().clone().requires_grad_()
        expected, got = norm(x), ours(x_ours)
        assert got.dtype == expected.dtype and got.shape == expected.shape, cls.__name__
        if dtype == torch.float32:  # the float32 sums' order
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=cls.__name__)
        else:
            ulp = torch.finfo(dtype).eps * expected.detach().float().abs()
            assert ((got.detach().float() - expected.detach().float()).abs() <= ulp).all(), cls.__name__
        grad = torch.randn_like(expected)
        expected.backward(grad)
        got.backward(grad)
        tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(x_ours.grad, x.grad, **tolerance, msg=cls.__name__)
        for (name, p), q in zip(norm.named_parameters(), ours.parameters()):
            scale = p.grad.abs().max().item()
            torch.testing.assert_close(q.grad, p.grad, rtol=tolerance["rtol"], atol=tolerance["atol"] * scale,
                                       msg=f"{cls.__name__}.{name}")
        checked += 1
    assert checked >= 0.9 * len(swapped)


def shrunk(config):
    """A model's default config at a test's size, where it names these sizes
    (its text and vision configs too)."""
    for name in getattr(config, "sub_configs", {}):
        if getattr(config, name, None) is not None:
            shrunk(getattr(config, name))
    for key, value in dict(SMALL, head_dim=8, n_embd=32, n_layer=2, n_head=4, d_model=32, num_layers=2,
                           moe_intermediate_size=32, num_experts=4, num_local_experts=4, n_routed_experts=4,
                           num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4,
                           qk_nope_head_dim=4, v_head_dim=8).items():
        if hasattr(config, key):
            try:
                setattr(config, key, value)
            except Exception:  # a derived or per-layer attribute
                pass
    return config


def tiny(cls, config, device):
    """A model of ``cls`` with seeded weights, nudged off their initial values, and its copy."""
    torch.manual_seed(0)
    model = cls(config).to(device).eval()
    for p in model.parameters():
        p.data.add_(0.02 * torch.randn_like(p))
    return model, copy.deepcopy(model)


@pytest.mark.parametrize("device", DEVICES)
def test_every_fused_causal_lm_trains_as_transformers(device):
    # Every causal LM class (vision-language ones included, given text only)
    # of the installed transformers whose loss patch() fuses, built from its
    # own default config shrunk to a few layers of width 32 (a class whose
    # unpatched model cannot be built or run that way is left out): the
    # patched model's loss and gradients are its own, and it makes no logits.
    # The scaled-logits models (Cohere, Granite, ...) among them, and Llama 4's
    # vision-language model (its loss on its inner causal LM's logits).
    from fastreduce_torch import hf

    classes = [cls for cls in model_classes(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"))
               if hf._loss_logits(cls) is not None]
    fused, ran = [], []
    for cls in classes:
        try:
            config = shrunk(cls.config_class())
            with torch.device("meta"):
                if sum(p.numel() for p in cls(config).parameters()) > 2e7:  # a size these keys do not set
                    continue
            model, ours = tiny(cls, config, device)
            ids = torch.randint(0, 90, (2, 9), device=device)
            labels = ids.clone()
            labels[0, :2] = -100
            expected = model(input_ids=ids, labels=labels)
        except Exception:  # a config these sizes do not fit
            continue
        ran.append(cls.__name__)
        fr.patch(ours)
        if type(ours) is type(model):  # its output embeddings are not the head its forward names
            continue
        got = ours(input_ids=ids, labels=labels)
        assert got.logits is None, cls.__name__
        torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=0, msg=cls.__name__)
        expected.loss.backward()
        got.loss.backward()
        assert_same_gradients(model, ours)
        fused.append(cls.__name__)
    assert len(fused) >= 0.4 * len(classes), (len(fused), len(classes))
    expected = {"CohereForCausalLM", "GraniteForCausalLM", "GraniteMoeForCausalLM", "HyperCLOVAXForCausalLM",
                "LlavaForConditionalGeneration", "Gemma3ForConditionalGeneration", "PaliGemmaForConditionalGeneration",
                "FalconForCausalLM", "Llama4ForConditionalGeneration"}
    assert expected & set(ran) <= set(fused)


def assert_same_gradients(model, ours, reference=None):
    """Every parameter's gradient within 1e-3 relative, or 1e-6 of the largest
    (some are zero but for rounding: a key projection's bias). Given the
    model's float64 copy after the same step: within twice the model's own
    error from it, or 1e-6 of the largest (where the model's float32 is
    itself off by more than 1e-3 at an element, ours may be the closer),
    where that copy's gradient is finite (LED's float64 copy gives NaN in 24
    of its gradients, its float32 none)."""
    pairs = [(key, p.grad, q.grad) for (key, p), q in zip(model.named_parameters(), ours.parameters())
             if p.grad is not None]
    top = max(a.abs().max().item() for _, a, _ in pairs)
    exact = dict(reference.named_parameters()) if reference is not None else {}
    for key, a, b in pairs:
        if key in exact and torch.isfinite(exact[key].grad).all():
            error_vs_reference(b, a, exact[key].grad, floor=1e-6 * top, what=key)
        else:
            torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-6 * top, msg=key)


# Causal LMs whose forward soft-caps the logits, cap * tanh(logits / cap), each
# its own way: where their model keeps the cap, and their config at a test's size.
SOFT_CAPPED = {
    # cap = self.config.logits_soft_cap, then in one line
    "RecurrentGemmaForCausalLM": ("config.logits_soft_cap", dict(num_hidden_layers=3, num_key_value_heads=1,
                                                                  lru_width=32, attention_window_size=16)),
    # self.final_logit_softcapping, three lines, unconditional
    "MistralLarge4ForConditionalGeneration": ("final_logit_softcapping", {
        "text_config.qk_head_dim": 8, "text_config.head_dim": 4, "text_config.num_key_value_heads": 4}),
    # after multiplying by the text config's output_multiplier
    "MuseGlimmerForConditionalGeneration": ("config.text_config.final_logit_softcapping",
                                            {"text_config.output_multiplier": 3.0}),
    "MuseSparkForConditionalGeneration": ("config.text_config.final_logit_softcapping",
                                          {"text_config.output_multiplier": 3.0}),
    # if self.config.final_logit_softcapping is not None
    "Gemma2ForCausalLM": ("config.final_logit_softcapping", {}),
    # a module of its own: self.logit_softcap(logits)
    "Inkling2ForCausalLM": ("logit_softcap.softcap", {}),
}


def _set(owner, path: str, value):
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    setattr(owner, name, value)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(SOFT_CAPPED))
def test_soft_capped_causal_lm_trains_as_transformers(name, device):
    if not hasattr(transformers, name):
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    cls = getattr(transformers, name)
    cap, sizes = SOFT_CAPPED[name]
    config = shrunk(cls.config_class())
    for path, value in sizes.items():
        _set(config, path, value)
    torch.manual_seed(0)
    model = cls(config).to(device).eval()
    for p in model.parameters():
        p.data.add_(0.1 * torch.randn_like(p))
    ids = torch.randint(0, 90, (2, 9), device=device)
    labels = ids.clone()
    labels[0, :2] = -100
    ours = copy.deepcopy(model)
    _set(model, cap, 1e6)
    with torch.no_grad():
        uncapped = model(input_ids=ids, labels=labels, use_cache=False).loss
    _set(model, cap, 0.5)
    _set(ours, cap, 0.5)
    expected = model(input_ids=ids, labels=labels, use_cache=False)
    assert (expected.loss - uncapped).abs() > 0.01  # the cap counts at these logits
    fr.patch(ours)
    assert type(ours) is not type(model)
    got = ours(input_ids=ids, labels=labels, use_cache=False)
    assert got.logits is None
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=0)
    expected.loss.backward()
    got.loss.backward()
    assert_same_gradients(model, ours)


class _CappedWhenTraining:
    def forward(self, hidden, labels=None):
        logits = self.lm_head(hidden)
        if self.training:
            logits = torch.tanh(logits / self.config.cap) * self.config.cap
        return self.loss_function(logits, labels)


class _CappedThenScaled:
    def forward(self, hidden, labels=None):
        logits = self.lm_head(hidden)
        logits = torch.tanh(logits / self.config.cap) * self.config.cap
        logits = logits * self.config.scale
        return self.loss_function(logits, labels)


class _CappedByWalrus:
    def forward(self, hidden, labels=None):
        logits = self.lm_head(hidden).float()
        if (cap := self.config.get_text_config().cap) is not None:
            logits = logits.float() / cap
            logits = logits.tanh()
            logits = cap * logits
        return self.loss_function(logits=logits, labels=labels)


class _Halve(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x / 2) * self.cap


class _HalvedByModule:
    def __init__(self):
        self.halve = _Halve()

    def forward(self, hidden, labels=None):
        logits = self.halve(self.lm_head(hidden))
        logits = self.halve(logits)
        return self.loss_function(logits, labels)


def test_soft_cap_read_only_where_the_forward_always_makes_it():
    from fastreduce_torch import hf

    assert hf._loss_logits(_CappedWhenTraining) is None
    assert hf._loss_logits(_CappedThenScaled) is None
    assert hf._loss_logits(_HalvedByModule) is None
    text_cap = (hf._Step("config"), hf._Step("get_text_config", call=True), hf._Step("cap"))
    assert hf._loss_logits(_CappedByWalrus) == hf._Logits(("lm_head",), softcap=text_cap)


@pytest.mark.parametrize("device", DEVICES)
def test_vision_language_model_with_images_fused(device):
    # Llava with an image: its vision tower and projector feed the language
    # model four image tokens; the fused loss and every gradient (the vision
    # tower's included) as the unpatched model's.
    text = transformers.LlamaConfig(**SMALL)
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, image_size=28, patch_size=14)
    config = transformers.LlavaConfig(text_config=text, vision_config=vision, image_token_id=96)
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(config).to(device).eval()
    ours = copy.deepcopy(model)
    assert fr.patch(ours) == norm_layers(model) > 0
    ids, labels = batch(device)
    ids[ids == 96] = 0
    ids[:, 4:8] = 96  # (28 / 14)^2 image tokens
    labels[:, 4:8] = -100
    pixels = torch.randn(2, 3, 28, 28, device=device)
    expected = model(input_ids=ids, pixel_values=pixels, labels=labels)
    got = ours(input_ids=ids, pixel_values=pixels, labels=labels)
    assert got.logits is None
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=0)
    expected.loss.backward()
    got.loss.backward()
    assert model.model.vision_tower.embeddings.patch_embedding.weight.grad.abs().max() > 0
    assert_same_gradients(model, ours)


def blip(kind: str, language: str = "OPT"):
    """A tiny Blip-2 or InstructBlip, four query tokens (image token 96), on a
    decoder-only OPT or an encoder-decoder T5 language model."""
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=28,
                  patch_size=14)
    qformer = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   encoder_hidden_size=32)
    if language == "OPT":
        text = transformers.OPTConfig(vocab_size=97, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                      num_attention_heads=4, word_embed_proj_dim=32, max_position_embeddings=64)
    else:
        text = transformers.T5Config(vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                     decoder_start_token_id=0)
    config = getattr(transformers, f"{kind}Config")(vision_config=vision, qformer_config=qformer,
                                                    text_config=text.to_dict(), num_query_tokens=4,
                                                    image_token_index=96)
    torch.manual_seed(0)
    return getattr(transformers, f"{kind}ForConditionalGeneration")(config).eval()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["Blip2", "InstructBlip"])
def test_query_token_models_fused(kind, device):
    # Blip-2 and InstructBlip on a decoder-only language model hand their loss
    # the inner causal LM's logits (Blip-2 those of the labels' last
    # positions: given labels shorter than the sequence, ours is the loss of
    # the same labels padded with ignored ones in front, as transformers 5.24's
    # own model cannot view the cut logits); on an encoder-decoder one, the
    # inner model computes the loss itself and patch() leaves it.
    from fastreduce_torch import hf

    if not hasattr(transformers, f"{kind}ForConditionalGeneration"):
        pytest.skip(f"transformers {transformers.__version__} has no {kind}")
    model = blip(kind).to(device)
    ours = copy.deepcopy(model)
    fr.patch(ours)
    assert type(ours) is not type(model)
    ids = torch.randint(0, 90, (2, 11), device=device)
    ids[:, :4] = 96
    labels = ids.clone()
    labels[:, :6] = -100
    inputs = dict(input_ids=ids, pixel_values=torch.randn(2, 3, 28, 28, device=device))
    if kind == "InstructBlip":
        inputs["qformer_input_ids"] = torch.randint(0, 90, (2, 5), device=device)
    expected = model(**inputs, labels=labels)
    got = ours(**inputs, labels=labels[:, 5:] if kind == "Blip2" else labels)
    assert got.logits is None
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=0)
    expected.loss.backward()
    got.loss.backward()
    assert_same_gradients(model, ours)
    on_t5 = blip(kind, "T5")
    assert not hf._loss_logits(type(on_t5)).holds(on_t5)  # its loss call is in the branch not taken
    fr.patch(on_t5)
    assert type(on_t5).__name__ == f"{kind}ForConditionalGeneration" and not hasattr(on_t5, "_fastreduce_logits")


def test_cohere_head_norms_keep_their_forward():
    # Cohere's q/k norms carry a weight a head, (heads, head_dim), over rows of head_dim.
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm
    norm = CohereLayerNorm((4, 12))
    norm.weight.data.normal_(1, 0.5)
    ours = copy.deepcopy(norm)
    assert fr.patch(torch.nn.Sequential(ours)) == 1
    x = torch.randn(3, 5, 4, 12)
    torch.testing.assert_close(ours(x), norm(x), rtol=0, atol=0)


def t5():
    config = transformers.T5Config(vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    for p in model.parameters():
        p.data.add_(0.1 * torch.randn_like(p))
    return model, copy.deepcopy(model)


def test_t5_norms_swapped():
    model, ours = t5()
    assert fr.patch(ours) == norm_layers(model) > 0
    ids, labels = batch("cpu")
    expected = model(input_ids=ids, labels=labels)
    with torch.profiler.profile() as prof:
        got = ours(input_ids=ids, labels=labels)
    assert "fastreduce::rms_norm" in {e.name for e in prof.events()}
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=0)


def test_gradient_accumulation_loss_and_tuple_outputs():
    model = build("llama", "cpu")
    ours = copy.deepcopy(model)
    fr.patch(ours)
    ids, labels = batch("cpu")
    items = torch.tensor(30)
    expected = model(input_ids=ids, labels=labels, num_items_in_batch=items).loss
    torch.testing.assert_close(ours(input_ids=ids, labels=labels, num_items_in_batch=items).loss, expected)
    as_tuple = ours(input_ids=ids, labels=labels, return_dict=False)
    torch.testing.assert_close(as_tuple[0], model(input_ids=ids, labels=labels).loss)


def test_loss_function_set_after_patch_is_used():
    # A loss of the user's own (trainers set model.loss_function) replaces the
    # fused one: the logits are made and handed to it, as unpatched.
    model = build("llama", "cpu")
    fr.patch(model)
    ids, labels = batch("cpu")
    fused = model(input_ids=ids, labels=labels).loss

    def doubled(logits, labels, vocab_size, **kwargs):
        return 2 * transformers.loss.loss_utils.ForCausalLMLoss(logits, labels, vocab_size, **kwargs)

    model.loss_function = doubled
    out = model(input_ids=ids, labels=labels)
    assert out.logits is not None
    torch.testing.assert_close(out.loss, 2 * fused, rtol=1e-5, atol=0)


@pytest.mark.parametrize("name", ["granite", "gemma2"])
def test_fused_loss_compiles_whole(name):
    # torch.compile(fullgraph=True) of a patched model with scaled logits
    # (Granite) or soft-capped ones (Gemma 2, at a cap that counts): the fused
    # loss (the output embeddings catching, the loss_function property, the
    # scale or cap read from the model) traces without a graph break, forward
    # and backward.
    model = build(name, "cpu")
    if name == "gemma2":
        model.config.final_logit_softcapping = 0.5
    ours = copy.deepcopy(model)
    fr.patch(ours)
    ids, labels = batch("cpu")
    expected = model(input_ids=ids, labels=labels).loss
    got = torch.compile(ours, fullgraph=True)(input_ids=ids, labels=labels).loss
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=0)
    expected.backward()
    got.backward()
    assert_same_gradients(model, ours)


def test_wrapped_causal_lm_fused():
    # A causal LM inside modules of another library (PEFT's PeftModel and
    # LoraModel hold it so): its loss is fused as at the top.
    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **kwargs):
            return self.inner(**kwargs)

    model = build("llama", "cpu")
    ours = Wrapper(Wrapper(copy.deepcopy(model)))
    assert fr.patch(ours) == norm_layers(model)
    ids, labels = batch("cpu")
    got = ours(input_ids=ids, labels=labels)
    assert got.logits is None
    torch.testing.assert_close(got.loss, model(input_ids=ids, labels=labels).loss, rtol=1e-5, atol=0)


def test_other_modules_untouched():
    model = build("llama", "cpu")
    before = {name: type(m) for name, m in model.named_modules()}
    fr.patch(model)
    for name, m in model.named_modules():
        if not (type(m).__name__.endswith("RMSNorm") or name in ("", "lm_head")):
            assert type(m) is before[name], name
    assert isinstance(model, transformers.LlamaForCausalLM)
    assert isinstance(model.model.norm, transformers.models.llama.modeling_llama.LlamaRMSNorm)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_bfloat16_and_compiled_on_cuda(name):
    model = build(name, "cuda", torch.bfloat16)
    ours = copy.deepcopy(model)
    fr.patch(ours)
    ids, labels = batch("cuda")
    expected = model(input_ids=ids, labels=labels).loss
    torch.testing.assert_close(ours(input_ids=ids, labels=labels).loss, expected, rtol=2e-2, atol=2e-2)
    compiled = torch.compile(ours)
    torch.testing.assert_close(compiled(input_ids=ids, labels=labels).loss, expected, rtol=2e-2, atol=2e-2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_training_step_memory_on_cuda():
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16)
    ids = torch.randint(0, 32000, (4, 1024), device="cuda")

    def peak(m):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        m(input_ids=ids, labels=ids).loss.backward()
        m.zero_grad(set_to_none=True)
        return torch.cuda.max_memory_allocated() - before

    plain = peak(model)
    fr.patch(model)
    fused = peak(model)
    logits = 4 * 1024 * 32000 * 2  # one bf16 logits tensor
    assert fused < plain - logits, (plain, fused)


# ---- encoder-decoders: the cross-entropy their own forward computes, fused


def encoder_decoder_config(cls):
    """The class's default config shrunk, with token ids inside a vocab of 97,
    and GELU for ReLU: a pre-activation within rounding of 0 flips ReLU's
    derivative where the patched norm rounds once and transformers' twice
    (Switch's decoder block 8, 6.3e-7 in float64: every gradient below it
    1.4e-3 of the largest from float64, transformers' 6.6e-7)."""
    config = shrunk(cls.config_class())
    for owner in (config, getattr(config, "decoder", None), getattr(config, "text_config", None)):
        for key in ("pad_token_id", "decoder_start_token_id"):
            if owner is not None and (getattr(owner, key, None) is None or getattr(owner, key) >= 90):
                setattr(owner, key, 0)
        for key in ("dense_act_fn", "activation_function"):
            if owner is not None and getattr(owner, key, None) == "relu":
                setattr(owner, key, "gelu")
    return config


def assert_fused_like_transformers(model, ours, **inputs):
    """Loss, gradients and (computed on demand) logits as the unpatched
    model's, the logits never made by the forward or the backward."""
    reference = copy.deepcopy(model).double()
    exact = reference(**{k: v.double() if v.is_floating_point() else v for k, v in inputs.items()})
    exact.loss.backward()
    expected = model(**inputs)
    LazyLogits.materializations = 0
    got = ours(**inputs)
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=0)
    expected.loss.backward()
    got.loss.backward()
    assert LazyLogits.materializations == 0
    assert isinstance(got.logits, LazyLogits)
    assert_same_gradients(model, ours, reference)
    # The bias added in the matmul. Switch's logits: transformers 2.9e-5 from float64, ours 9.3e-6.
    error_vs_reference(got.logits * 1, expected.logits, exact.logits.detach(), floor=1e-5, what="logits")


@pytest.mark.parametrize("device", DEVICES)
def test_every_encoder_decoder_trains_as_transformers(device):
    # Every encoder-decoder class of the installed transformers whose forward
    # computes a cross-entropy and that runs on token ids at this size (T5,
    # BART, Pegasus, M2M100, NLLB-MoE, Switch, ...): the patched model's loss,
    # gradients and logits are its own, and neither pass makes the logits.
    from fastreduce_torch import hf

    fused = []
    for cls in model_classes(("ForConditionalGeneration", "MTModel")):
        if not hf._computes_cross_entropy(cls):
            continue
        try:
            config = encoder_decoder_config(cls)
            if not getattr(config, "is_encoder_decoder", False):
                continue
            model, ours = tiny(cls, config, device)
            ids = torch.randint(3, 90, (2, 9), device=device)
            labels = torch.randint(3, 90, (2, 6), device=device)
            labels[0, :2] = -100
            model(input_ids=ids, labels=labels)
        except Exception:  # a config these sizes do not fit, or inputs other than token ids
            continue
        fr.patch(ours)
        assert type(ours) is not type(model), cls.__name__
        assert_fused_like_transformers(model, ours, input_ids=ids, labels=labels)
        fused.append(cls.__name__)
    expected = {"T5ForConditionalGeneration", "MT5ForConditionalGeneration", "BartForConditionalGeneration",
                "PegasusForConditionalGeneration", "M2M100ForConditionalGeneration",
                "NllbMoeForConditionalGeneration", "SwitchTransformersForConditionalGeneration"}
    assert expected & {cls.__name__ for cls in model_classes(("ForConditionalGeneration",))} <= set(fused)


def whisper():
    config = transformers.WhisperConfig(vocab_size=97, d_model=32, encoder_layers=1, decoder_layers=1,
                                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                        decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16,
                                        max_target_positions=32, pad_token_id=0, decoder_start_token_id=1,
                                        bos_token_id=1, eos_token_id=2)
    return transformers.WhisperForConditionalGeneration(config)


def marian():
    config = transformers.MarianConfig(vocab_size=97, d_model=32, encoder_layers=1, decoder_layers=1,
                                       encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                       decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0,
                                       decoder_start_token_id=0)
    return transformers.MarianMTModel(config)


def bert2gpt2():
    encoder = transformers.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                      intermediate_size=64)
    decoder = transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=1, n_head=4, n_positions=64,
                                      add_cross_attention=True, is_decoder=True)
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id = config.pad_token_id = 0
    return transformers.EncoderDecoderModel(config=config)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make", [whisper, marian, bert2gpt2])
def test_speech_translation_and_composed_encoder_decoders_fused(make, device):
    # Whisper (audio features in), Marian (its final_logits_bias added in the
    # same line as the head), a BERT encoder with a GPT-2 decoder (the loss on
    # the decoder's logits, computed by the EncoderDecoderModel).
    torch.manual_seed(0)
    model = make().to(device).eval()
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    if make is marian:
        model.final_logits_bias.normal_()
    ours = copy.deepcopy(model)
    fr.patch(ours)
    labels = torch.randint(3, 90, (2, 6), device=device)
    labels[1, 4:] = -100
    if make is whisper:
        inputs = dict(input_features=torch.randn(2, 8, 32, device=device))
    else:
        inputs = dict(input_ids=torch.randint(3, 90, (2, 9), device=device))
    assert_fused_like_transformers(model, ours, labels=labels, **inputs)


def test_encoder_decoder_under_autocast_in_bfloat16_and_as_tuple():
    # Under autocast the logits are bfloat16 and the loss float32, as
    # F.cross_entropy's autocast gives; a bfloat16 model's loss is bfloat16;
    # return_dict=False gives the loss first; generate() is unchanged.
    model, ours = t5()
    fr.patch(ours)
    ids, labels = batch("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(input_ids=ids, labels=labels)
        got = ours(input_ids=ids, labels=labels)
    assert got.loss.dtype == expected.loss.dtype == torch.float32
    assert got.logits.dtype == expected.logits.dtype == torch.bfloat16
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=0)
    as_tuple = ours(input_ids=ids, labels=labels, return_dict=False)
    torch.testing.assert_close(as_tuple[0], model(input_ids=ids, labels=labels).loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(ours.generate(ids, max_new_tokens=4, do_sample=False),
                               model.generate(ids, max_new_tokens=4, do_sample=False), rtol=0, atol=0)
    expected = model.bfloat16()(input_ids=ids, labels=labels).loss
    got = ours.bfloat16()(input_ids=ids, labels=labels).loss
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2, atol=0)


def test_encoder_decoder_compiles():
    # Compiled, the forward runs as transformers wrote it (no lazy logits).
    model, ours = t5()
    fr.patch(ours)
    ids, labels = batch("cpu")
    got = torch.compile(ours)(input_ids=ids, labels=labels)
    torch.testing.assert_close(got.loss, model(input_ids=ids, labels=labels).loss, rtol=1e-5, atol=0)
