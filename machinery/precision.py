"""bf16: the autocast around each stage, `cast_once` windows, the reference's bf16 copy, and what
--dtype=auto picks.

    python train.py --dtype=bf16                    # every forward in bf16 autocast
    python -m pytest -q tests/test_precision.py     # bf16 against fp32, and the casts counted

--dtype=bf16 is torch.autocast around each stage (`autocast`) with its weight cache off, and
`cast_once` windows inside which each trainable weight is cast to bf16 once: one `generate`, one
PPO minibatch's forwards. Weights, gradients and AdamW's states stay fp32; log-probs, KL and losses
are taken in fp32 (model.response_logits), so no loss scaling is needed. A frozen reference scores
through `linears_in_bf16`, its matmul weights cast once, not at every forward. --dtype=auto is bf16
where the device multiplies bf16 natively (`auto_dtype`), else fp32.
Left out: fp16 with loss scaling, fp8, bf16 optimizer states.
"""
import contextlib, copy, os
import torch
import torch.nn as nn


def autocast(device, dtype):
    """The precision of every forward in a stage: bf16 autocast, or fp32 (a no-op). One setting
    for the rollout, the old log-probs, the reference and the update, so the first ratio is 1 and
    the first KL 0."""
    # cache_enabled=False: autocast caches the bf16 copy of each weight until the context exits;
    # a context held around a whole stage would then train fp32 weights while every forward kept
    # reading their first bf16 copy. `cast_once` turns the cache on where no weight can change.
    assert dtype in ("fp32", "bf16"), f"dtype {dtype!r}: --dtype=auto is resolved by train.parse"
    device_type = device.split(":")[0]
    return torch.autocast(device_type, torch.bfloat16, enabled=dtype == "bf16", cache_enabled=False)


def bf16_autocast(device_type):
    """True inside bf16 autocast on this kind of device (--dtype=bf16's `autocast`)."""
    if not torch.is_autocast_enabled(device_type):
        return False
    return torch.get_autocast_dtype(device_type) == torch.bfloat16


@contextlib.contextmanager
def cast_once(*models):
    """Within, under bf16 autocast, each trainable weight is cast to bf16 once and that copy serves
    every forward (autocast's weight cache: it holds fp32 leaves that require grad, so frozen
    weights are still cast per forward: the reference has `linears_in_bf16`). The copies are
    dropped on exit, so the first forward after an optimizer step casts the new weights. No weight
    of `models` may change inside: checked on exit. fp32: a no-op. A window pays where a weight is
    read more than once: generate reads it once per token."""
    if not any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda")):
        yield
        return
    params = [p for m in models if m is not None for p in m.parameters() if p.requires_grad]
    # A tensor's version is bumped by every in-place change (an optimizer step, copy_).
    before = [p._version for p in params]
    was = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(True)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(was)
        # torch.autocast clears the cache only when the outermost context exits.
        torch.clear_autocast_cache()
    if [p._version for p in params] != before:
        raise RuntimeError("a weight changed inside cast_once: the forwards after the change "
                           "read its old bf16 copy")


def linears_in_bf16(model):
    """A copy of `model` whose every nn.Linear holds its weight and bias in bf16, the rest shared
    (new modules, the same tensors). autocast casts a frozen weight again at every forward (its
    cache holds only weights that require grad), the same fp32 values to the same bf16 ones, so
    under bf16 autocast this copy gives autocast's own numbers bit for bit; embeddings and
    LayerNorms, which autocast leaves in fp32, are the same tensors (the output layer is untied
    from the embedding in the copy alone)."""
    shared = [*model.parameters(), *model.buffers()]
    copied = copy.deepcopy(model, {id(t): t for t in shared})
    for m in copied.modules():
        if isinstance(m, nn.Linear):
            for name in ("weight", "bias"):
                if getattr(m, name) is not None:
                    half = getattr(m, name).to(torch.bfloat16)
                    setattr(m, name, nn.Parameter(half, requires_grad=False))
    return copied


def deterministic():
    """--deterministic: PyTorch's deterministic algorithms (an op without one raises), and on CUDA
    cuBLAS's fixed workspace (read when its first handle is made, so set before any CUDA work) and
    cuDNN without autotuning. The CPU's kernels are deterministic already."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def auto_dtype(device):
    """--dtype=auto on `device` (cpu or cuda): (bf16 or fp32, why). bf16 where the hardware
    multiplies bf16 natively: a CUDA device with bf16 units (not emulated), a CPU with AVX512-BF16
    or AMX-BF16 (x86) or BF16 (ARM); elsewhere bf16 matmuls are emulated, slower than fp32."""
    if device.startswith("mps"):
        return "fp32", "bf16 on Apple's GPU is not measured here"
    if device.startswith("cuda"):
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bf16", "the CUDA device has bf16 units"
        return "fp32", "the CUDA device emulates bf16"
    caps = torch.cpu.get_capabilities()
    found = [k for k in ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16") if caps.get(k)]
    if found:
        return "bf16", f"the CPU has {', '.join(found)}"
    return "fp32", "the CPU has no native bf16 instructions (avx512_bf16, amx_bf16, bf16)"
