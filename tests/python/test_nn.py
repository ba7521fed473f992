"""fp4kit.nn: Linear and convert, against the dequantized model. CPU part runs wherever torch is
installed (the CPU reference GEMM); the GPU part runs the kernels, including a converted Hugging Face
LlamaForCausalLM (random weights, small config) when transformers is installed."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'fp4kit[torch]')")
import fp4kit  # noqa: E402
from fp4kit import nn as fnn  # noqa: E402

_GPU = torch.cuda.is_available() and fp4kit.cuda_device_count() > 0
DEVICES = ["cpu"] + (["cuda"] if _GPU else [])


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_linear_matches_dequantized(device, fmt):
    torch.manual_seed(0)
    lin = torch.nn.Linear(320, 72, bias=True).to(device=device, dtype=torch.bfloat16)
    q = fnn.Linear.from_linear(lin, fmt)
    assert q.weight_packed.device.type == device and "format=" + fmt in repr(q)
    x = torch.randn(4, 7, 320, device=device, dtype=torch.bfloat16)
    ref = x.float() @ q.dequantized_weight().to(device).t() + lin.bias.float()
    y = q(x)
    assert y.shape == (4, 7, 72) and y.dtype == torch.bfloat16
    assert _rel(y, ref) < 1e-2


def test_convert_respects_exclude_and_group():
    model = torch.nn.Sequential()
    model.add_module("up", torch.nn.Linear(64, 128))
    model.add_module("odd", torch.nn.Linear(40, 16))   # 40 % 16 != 0: kept as is
    model.add_module("lm_head", torch.nn.Linear(128, 10))
    model.to(torch.bfloat16)
    fnn.convert(model, "nvfp4")
    assert isinstance(model.up, fnn.Linear)
    assert isinstance(model.odd, torch.nn.Linear) and not isinstance(model.odd, fnn.Linear)
    assert isinstance(model.lm_head, torch.nn.Linear) and not isinstance(model.lm_head, fnn.Linear)


def test_state_dict_round_trip():
    lin = torch.nn.Linear(64, 32).to(torch.bfloat16)
    q = fnn.Linear.from_linear(lin, "mxfp4")
    q2 = fnn.Linear(64, 32, True, "mxfp4")
    q2.load_state_dict(q.state_dict())
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert torch.equal(q(x), q2(x))


def test_errors():
    with pytest.raises(ValueError, match="in_features: must be a multiple of the nvfp4 group size 16"):
        fnn.Linear(40, 8)
    with pytest.raises(TypeError, match="dtype: must be torch.bfloat16 or torch.float16"):
        fnn.Linear(64, 8, dtype=torch.float32)
    with pytest.raises(TypeError, match="linear: must be a torch.nn.Linear"):
        fnn.Linear.from_linear(torch.nn.ReLU())


@pytest.mark.skipif(not _GPU, reason="no CUDA device visible to torch and fp4kit")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_converted_llama_matches_dequantized_model(fmt):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    fnn.convert(model, fmt)
    # The reference: the same model with every fp4kit Linear replaced by a bf16 Linear holding the
    # dequantized weight.
    ref = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    ref.load_state_dict(model.state_dict(), strict=False)
    for name, mod in model.named_modules():
        if isinstance(mod, fnn.Linear):
            lin = ref.get_submodule(name)
            lin.weight.data.copy_(mod.dequantized_weight().to("cuda", torch.bfloat16))
    ids = torch.randint(0, 512, (2, 24), device="cuda")
    with torch.no_grad():
        a = model(ids).logits.float()
        b = ref(ids).logits.float()
    assert _rel(a, b) < 2e-2


@pytest.mark.parametrize("device", DEVICES)
def test_friendly_gemm_on_fp4weight(device):
    w = fp4kit.FP4Weight.from_float(torch.randn(80, 256), "nvfp4").to(device).prepack()
    x = torch.randn(2, 3, 256, device=device, dtype=torch.float16)
    bias = torch.randn(80, device=device, dtype=torch.float16)
    ref = x.float() @ w.dequantize().to(device).t() + bias.float()
    y = fp4kit.gemm(x, w, bias)
    assert y.shape == (2, 3, 80) and _rel(y, ref) < 2e-3
    out = torch.empty_like(y)
    if device == "cuda":
        assert fp4kit.gemm(x, w, bias, out=out) is out and torch.equal(out, y)
    with pytest.raises(ValueError, match="prepack it once first"):
        fp4kit.gemm(x, fp4kit.FP4Weight.from_float(torch.randn(16, 64), "nvfp4"))
    with pytest.raises(TypeError, match="w: must be an FP4Weight"):
        fp4kit.gemm(x, torch.zeros(3))


def test_friendly_functions_take_torch_tensors():
    w = torch.randn(48, 128)
    packed, scales, ts = fp4kit.quantize(w, "nvfp4")
    assert isinstance(packed, torch.Tensor) and packed.dtype == torch.uint8
    deq = fp4kit.dequantize(packed, scales, ts, "nvfp4")
    assert isinstance(deq, torch.Tensor) and deq.shape == (48, 128)
    np_p, np_s, np_t = fp4kit.quantize(w.numpy(), "nvfp4")
    assert torch.equal(packed, torch.from_numpy(np_p))
    assert torch.equal(deq, torch.from_numpy(fp4kit.dequantize(np_p, np_s, np_t, "nvfp4")))
    buf = fp4kit.prepack(packed, scales, ts, "nvfp4")
    assert torch.equal(buf, torch.from_numpy(fp4kit.prepack(np_p, np_s, np_t, "nvfp4")))
