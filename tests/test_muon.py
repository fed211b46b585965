"""optim.Muon and optim.newton_schulz against slow, obviously-right references: the iteration against the scalar
quintic applied to each singular value of an fp64 SVD (and its distance to the polar factor U·Vᵀ, within the
quintic's known spread), the optimizer against torch.optim.Muon run side by side (both orthogonalise in bf16 there,
so only bf16's rounding may differ), the iteration's dtype honoured, and pretrain_optimizer's dtype choice.
Checkpoint and resume of a Muon pretraining: tests/test_pretrain_optim.py."""
import pytest
import torch

from machinery import optim
from model import GPT, GPTConfig
from pipeline.pretrain import PretrainConfig

# Tall, wide and square, as the blocks' matrices are (fc 128x512, proj 512x128, attention 128x128).
SHAPES = [(24, 72), (72, 24), (40, 40)]


def svd_quintic(g):
    """U · p⁵(S / ‖g‖_F) · Vᵀ in fp64, p(σ) = aσ + bσ³ + cσ⁵ applied to each singular value on its own."""
    a, b, c = optim.NS_COEFFICIENTS
    u, s, vh = torch.linalg.svd(g.double(), full_matrices=False)
    sigma = s / s.norm()
    for _ in range(5):
        sigma = a * sigma + b * sigma ** 3 + c * sigma ** 5
    return u @ torch.diag(sigma) @ vh, u @ vh


@pytest.mark.parametrize("shape", SHAPES)
def test_newton_schulz_is_the_quintic_on_each_singular_value_of_an_fp64_svd(shape):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    want, _ = svd_quintic(g)
    got = optim.newton_schulz(g, dtype=torch.float32)
    assert got.dtype == torch.float32 and got.shape == g.shape
    assert float((got.double() - want).norm() / want.norm()) < 1e-5


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_newton_schulz_is_close_to_the_polar_factor_within_the_quintics_spread(shape):
    """Five quintic steps leave every singular value of a well-conditioned matrix in about [0.68, 1.14] (Keller
    Jordan's coefficients do not converge to 1 by design), so the result is within about 0.22 of U·Vᵀ."""
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(2)) * 7.0
    _, polar = svd_quintic(g)
    got = optim.newton_schulz(g, dtype=torch.float64)
    sv = torch.linalg.svdvals(got)
    assert 0.6 < float(sv.min()) and float(sv.max()) < 1.25
    assert float((got - polar).norm() / polar.norm()) < 0.3
    # Orthogonalising an orthogonal-ish matrix again moves it towards U·Vᵀ, not away.
    again = optim.newton_schulz(got, dtype=torch.float64)
    assert float((again - polar).norm()) < float((got - polar).norm())


def twin_params(seed):
    gen = torch.Generator().manual_seed(seed)
    ws = [torch.randn(*s, generator=gen) for s in SHAPES]
    return [torch.nn.Parameter(w.clone()) for w in ws], [torch.nn.Parameter(w.clone()) for w in ws]


def run_steps(opt, params, grads):
    for g in grads:
        for p, gp in zip(params, g, strict=True):
            p.grad = gp.clone()
        opt.step()


@pytest.mark.parametrize("lr,momentum,wd", [(0.02, 0.95, 0.01), (0.05, 0.8, 0.0)])
def test_muon_in_bf16_steps_as_torch_optim_muon_up_to_bf16_rounding(lr, momentum, wd):
    ours, theirs = twin_params(3)
    gen = torch.Generator().manual_seed(4)
    grads = [[torch.randn(*s, generator=gen) for s in SHAPES] for _ in range(4)]
    mine = optim.Muon(ours, lr, momentum, wd, ns_dtype=torch.bfloat16)
    ref = torch.optim.Muon(theirs, lr=lr, momentum=momentum, nesterov=True, weight_decay=wd,
                           adjust_lr_fn="original")
    exact = [torch.nn.Parameter(p.detach().double()) for p in ours]
    start = [p.detach().clone() for p in ours]
    run_steps(mine, ours, grads)
    run_steps(ref, theirs, grads)
    run_steps(optim.Muon(exact, lr, momentum, wd, ns_dtype=torch.float64), exact, [[g.double() for g in s]
                                                                                     for s in grads])
    for p, q, e, p0 in zip(ours, theirs, exact, start, strict=True):
        moved = float((q - p0).detach().norm())
        # bf16 keeps 8 bits of mantissa and five Newton-Schulz steps amplify a rounding flip: after 4 steps the two
        # agree to about 3 % of the distance moved, and each is as far from the fp64 iteration as from the other.
        apart = float((p - q).detach().norm())
        assert moved > 0.1 and apart < 0.05 * moved
        assert float((q.double() - e).detach().norm()) > 0.3 * apart
        assert torch.equal(mine.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"])


def test_the_iterations_dtype_is_the_one_asked_for():
    """fp32 and bf16 iterations give different updates (bf16's rounding), and the fp32 one is the fp64 one to fp32's
    precision: the dtype is used, not ignored."""
    a32, a16 = twin_params(5)
    a64 = [torch.nn.Parameter(p.detach().double()) for p in a32]
    grads = [[torch.randn(*s, generator=torch.Generator().manual_seed(6)) for s in SHAPES]]
    run_steps(optim.Muon(a32, 0.02, 0.95, 0.01, ns_dtype=torch.float32), a32, grads)
    run_steps(optim.Muon(a16, 0.02, 0.95, 0.01, ns_dtype=torch.bfloat16), a16, grads)
    run_steps(optim.Muon(a64, 0.02, 0.95, 0.01, ns_dtype=torch.float64), a64, [[g.double() for g in grads[0]]])
    for p32, p16, p64 in zip(a32, a16, a64, strict=True):
        assert float((p32.detach().double() - p64.detach()).abs().max()) < 1e-6
        assert float((p16.detach().double() - p64.detach()).abs().max()) > 1e-5


@pytest.mark.parametrize("dtype,want", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_pretrain_optimizer_runs_newton_schulz_in_the_runs_dtype(dtype, want):
    model = GPT(GPTConfig(block_size=16, vocab_size=40, n_layer=2, n_head=2, n_embd=16))
    opt = optim.pretrain_optimizer(model, PretrainConfig(optimizer="muon"), dtype)
    assert isinstance(opt.opts[0], optim.Muon) and opt.opts[0].ns_dtype == want


def test_a_stack_is_orthogonalised_matrix_by_matrix():
    """Muon orthogonalises the matrices of one shape as one batch: each must come out as it would alone."""
    stack = torch.randn(3, 24, 72, generator=torch.Generator().manual_seed(7)) * torch.tensor([0.1, 1.0, 30.0])[:, None, None]
    got = optim.newton_schulz(stack, dtype=torch.float64)
    for i in range(3):
        want, _ = svd_quintic(stack[i])
        assert float((got[i].double() - want).norm() / want.norm()) < 1e-5
