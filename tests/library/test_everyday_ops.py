"""The ops of everyday vision, audio and numerical code, and their backwards, run
unboxed too (DirectKernel).

Resizing and padding (UNets, detection necks, vocoders), pooling, the activations of
mobile and detection networks, in-place activations (``nn.ReLU(inplace=True)``), shifted
windows, statistics, the losses of segmentation and binary classification, and the long tail
(super-resolution, embedding bags, recurrent cells, spatial transformers, spectra, CTC,
histograms, small linear algebra): each call
of an op without an unboxed kernel pays the boxed fallback's host time. Each case must
give eager's values and gradients, and make no boxed call an unboxed kernel could have
served where relay's memory is on the target.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from checks import assert_same, run_both, served_unboxed

import torch_fallback.relay  # noqa: F401  (registers the relay device)
from torch_fallback.testing.calls import assert_served_as_placed

pytestmark = pytest.mark.usefixtures("placement")

IMAGE = (2, 4, 5, 5)


def embedding_bags(weight, per_sample_weights):
    """Two bags of four rows of weight, as the mean, the max and the weighted sum."""
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9], device=weight.device)
    offsets = torch.tensor([0, 4], device=weight.device)
    return (F.embedding_bag(indices, weight, offsets, mode="mean"),
            F.embedding_bag(indices, weight, offsets, mode="max"),
            F.embedding_bag(indices, weight, offsets, mode="sum",
                            per_sample_weights=per_sample_weights))  # fmt: skip


# name -> a function of one float64 tensor of shape IMAGE, differentiable in it
CALLS = {
    "upsample nearest": lambda x: F.interpolate(x, scale_factor=2),
    "upsample bilinear": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "upsample bicubic": lambda x: F.interpolate(x, size=7, mode="bicubic", align_corners=True),
    "upsample 1d and 3d": lambda x: (
        F.interpolate(x.flatten(2), scale_factor=2, mode="linear"),
        F.interpolate(x.flatten(2), scale_factor=2),
        F.interpolate(x.unsqueeze(2), scale_factor=2),
        F.interpolate(x.unsqueeze(2), scale_factor=2, mode="trilinear"),
    ),
    "reflection pad": lambda x: (F.pad(x, (1, 2, 2, 1), mode="reflect"),
                                 F.pad(x.flatten(2), (2, 1), mode="reflect")),
    "replication pad": lambda x: (F.pad(x, (1, 2, 2, 1), mode="replicate"),
                                  F.pad(x.flatten(2), (2, 1), mode="replicate")),
    "pooling": lambda x: (F.avg_pool2d(x, 2), F.adaptive_avg_pool2d(x, 3)),
    "unfold and fold": lambda x: F.fold(F.unfold(x, 2), (5, 5), 2),
    "shifted windows": lambda x: torch.roll(x, (2, -1), (2, 3)) + torch.flip(x, (3,)),
    "activations": lambda x: (F.softplus(x), F.elu(x), F.leaky_relu(x, 0.1), F.hardswish(x),
                              F.hardsigmoid(x), F.glu(x, 1), F.mish(x)),
    "in-place activations": lambda x: (F.relu(x * 1, inplace=True), F.silu(x * 1, inplace=True),
                                       torch.sigmoid_(x * 1), torch.tanh_(x * 1)),
    "pointwise": lambda x: (torch.erf(x), torch.atan2(x, x + 3), torch.atan(x), torch.tan(x / 4),
                            x.abs().log1p(), torch.expm1(x), x.abs().add(1).log2(),
                            x.abs().add(1).log10(), torch.lerp(x, 2 * x, 0.3),
                            torch.addcmul(x, x, x, value=0.5), torch.addcdiv(x, x, x.exp()),
                            torch.xlogy(x.abs(), x.abs() + 1), torch.erfinv(x.tanh() * 0.9)),
    "statistics": lambda x: (x.var(1), x.std(), *torch.var_mean(x, (2, 3)),
                             *torch.std_mean(x, 1), x.prod(1), x.cumprod(3), x.median(),
                             x.min(), torch.logsumexp(x, 1)),
    "losses": lambda x: (F.binary_cross_entropy(x.sigmoid(), x.detach().flip(0).sigmoid()),
                         F.huber_loss(x, torch.zeros_like(x)),
                         F.cross_entropy(x, (x[:, 0] > 0).long())),
    "distances": lambda x: (torch.cdist(x[0, 0], x[1, 0]),
                            F.cosine_similarity(x[0], x[1], dim=0)),
    "masks and indexing": lambda x: (
        x.masked_fill(x > 0.5, torch.tensor(0.25, dtype=x.dtype, device=x.device)),
        torch.zeros_like(x).masked_scatter(x > 0, x),
        torch.zeros(2, 6, 5, 5, dtype=x.dtype, device=x.device).index_copy(
            1, torch.tensor([5, 0, 3, 1], device=x.device), x),
        x.index_fill(1, torch.tensor([2], device=x.device), -1.0),
        x.index_fill(1, torch.tensor([0, 3], device=x.device),
                     torch.tensor(-2.0, dtype=x.dtype, device=x.device)),
    ),
    "super-resolution": lambda x: (F.pixel_shuffle(x, 2), F.pixel_unshuffle(x[..., :4, :4], 2)),
    "bags of embeddings": lambda x: embedding_bags(x.reshape(40, 5), x.flatten()[:8].sigmoid()),
    "recurrent cells": lambda x: (
        *torch.lstm_cell(x[0, 0], (x[1, 0], x[1, 1]), x[0].reshape(20, 5), x[1].reshape(20, 5),
                         x[0, 2, 0].repeat(4), x[1, 2, 0].repeat(4)),
        torch.gru_cell(x[0, 0], x[1, 0], x[0, :3].reshape(15, 5), x[1, :3].reshape(15, 5),
                       x[0, 3, 0].repeat(3), x[1, 3, 0].repeat(3)),
    ),
    "shrinkage, PReLU and logit": lambda x: (F.hardshrink(x, 0.3), F.softshrink(x, 0.3),
                                             F.prelu(x, x[0, :, 0, 0]),
                                             torch.logit(x.sigmoid() * 0.8 + 0.1)),
    "spatial transformers": lambda x: (F.adaptive_max_pool2d(x, 3),
                                       F.grid_sample(x, x[:, :2].permute(0, 2, 3, 1).tanh(),
                                                     align_corners=False)),
    "spectra and CTC": lambda x: (
        torch.fft.rfft(x).abs(), torch.fft.fft(x).real, torch.fft.irfft(torch.fft.rfft(x), n=5),
        F.ctc_loss(x.reshape(10, 2, 10).log_softmax(2),
                   torch.tensor([[1, 2, 3], [4, 5, 6]], device=x.device), [10, 10], [3, 3]),
    ),
    "small linear algebra": lambda x: (
        torch.linalg.inv(x[0, 0] + 5 * torch.eye(5, dtype=x.dtype, device=x.device)),
        torch.linalg.solve(x[0, 0] + 5 * torch.eye(5, dtype=x.dtype, device=x.device), x[1, 0]),
        torch.trace(x[0, 0]), torch.mv(x[0, 0], x[1, 0, 0]),
    ),
    "more pointwise": lambda x: (torch.fmax(x, x.flip(0)), torch.fmin(x, x.flip(0)),
                                 torch.copysign(x, x.flip(0)), torch.hypot(x, x.flip(0)),
                                 F.pairwise_distance(x[0], x[1]),
                                 F.margin_ranking_loss(x[0], x[1], torch.sign(x[1].detach()))),
    "in-place pointwise and activations": lambda x: (
        (x * 1).sin_(), (x * 1).cos_(), (x.abs() + 1).sqrt_(), (x.abs() + 1).rsqrt_(),
        (x.abs() + 1).log1p_(), (x * 1).neg_(), (x.abs() + 1).reciprocal_(), (x * 1).exp2_(),
        F.elu(x * 1, inplace=True), F.hardtanh(x * 1, inplace=True),
        F.leaky_relu(x * 1, 0.1, inplace=True), F.hardswish(x * 1, inplace=True),
        F.hardsigmoid(x * 1, inplace=True), F.mish(x * 1, inplace=True),
        (x * 1).clamp_(max=0.5), (x * 1).clamp_(x.flip(0) - 1, x.flip(0) + 1),
        (x * 1).lerp_(x.flip(0), 0.3), (x * 1).lerp_(x.flip(0), x.sigmoid()), (x * 1).pow_(2),
        (x.abs() + 1).pow_(x.flip(0)), (x * 1).cumsum_(1), (x * 1).atan2_(x.flip(0) + 3),
    ),
    "hyperbolic, inverse trigonometric and special": lambda x: (
        torch.asinh(x), torch.sinh(x), torch.cosh(x), torch.sinc(x), torch.acos(x.tanh() * 0.9),
        torch.asin(x.tanh() * 0.9), torch.atanh(x.tanh() * 0.9), torch.acosh(x.abs() + 1.5),
        torch.digamma(x.abs() + 1), torch.lgamma(x.abs() + 1), torch.polygamma(1, x.abs() + 1),
        torch.special.i0(x), torch.special.i1(x), torch.special.i0e(x), torch.erfc(x),
        torch.exp2(x), torch.logaddexp(x, x.flip(0)), torch.logaddexp2(x, x.flip(0)),
        torch.clamp(x, max=0.5), torch.clamp(x, x.flip(0) * 0.1 - 0.5, x.flip(0) * 0.1 + 0.5),
        torch.clamp_max(x, x.flip(0)), F.threshold(x, 0.1, -1.0),
    ),
    "cumulative and robust statistics": lambda x: (
        x.cummax(3)[0], x.cummin(2)[0], x.logcumsumexp(1), x.flatten().nanmedian(),
        torch.linalg.cross(x[0, 0, :3], x[1, 0, :3], dim=0), torch.dot(x[0, 0, 0], x[1, 0, 0]),
        torch.vdot(x[0, 1, 0], x[1, 1, 0]), torch.renorm(x, 2, 1, 1.0),
    ),
    "3-d pooling, exact resizing and shuffles": lambda x: (
        F.avg_pool3d(x.unsqueeze(0), 2), F.max_pool3d(x.unsqueeze(0), 2),
        F.adaptive_avg_pool3d(x.unsqueeze(0), 2),
        F.interpolate(x, scale_factor=2, mode="nearest-exact"),
        F.interpolate(x.flatten(2), scale_factor=2, mode="nearest-exact"),
        F.interpolate(x.unsqueeze(2), scale_factor=2, mode="nearest-exact"),
        F.channel_shuffle(x, 2),
        F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2, output_size=(5, 5)),
    ),
}  # fmt: skip

# name -> a function of one float64 tensor of shape IMAGE, for integer or boolean results
INTEGER_CALLS = {
    "rounding and tests": lambda x: (torch.round(x * 4), torch.trunc(x * 4), torch.frac(x * 4),
                                     torch.isnan(x.log()), x.argmin(), 2 ** x.round(),
                                     torch.fmod(x * 4, 1.5), torch.fmod(x * 4, x.abs() + 1)),
    "bits and buckets": lambda x: (
        (x > 0).long() ^ (x < 0.5).long(),
        torch.bucketize(x, torch.tensor([-1.0, 0.0, 1.0], dtype=x.dtype, device=x.device)),
    ),
    "histograms and counts": lambda x: (
        torch.histc(x, 10, -2.0, 2.0), torch.bincount((x.abs() * 3).long().flatten()),
        torch.searchsorted(torch.tensor([-1.0, 0.0, 1.0], dtype=x.dtype, device=x.device),
                           x.flatten(1)),
        torch.count_nonzero(x > 0, dim=1), *x.round().mode(1),
        *torch.unique(x.round(), return_inverse=True, return_counts=True),
        torch.heaviside(x.round(), x.flip(0)),
    ),
    "in-place comparisons, rounding and shifts": lambda x: (
        (x * 1).lt_(0), (x * 1).ne_(0.5), (x * 4).round().eq_(0), (x * 1).ge_(0.1),
        (x * 1).gt_(-0.1), (x * 1).le_(0.2), (x * 4).floor_(), (x * 4).ceil_(), (x * 4).round_(),
        (x * 4).trunc_(), (x * 1).sign_(), (x * 4).remainder_(x.abs() + 1),
        (x * 4).div_(x.abs() + 1, rounding_mode="floor"),
        (x * 4).floor_divide_(x.abs() + 1), (x * 1).fill_(torch.tensor(0.5, dtype=x.dtype)),
        (x * 4).long().bitwise_and_((x > 0).long() * 3), (x * 4).long().bitwise_or_(1),
        (x * 4).long().bitwise_xor_(2), torch.bitwise_left_shift(x.abs().mul(4).long(), 2),
        torch.bitwise_right_shift(x.abs().mul(40).long(), 2), x.abs().mul(4).long() << 1,
        x.abs().mul(40).long() >> (x > 0).long(), torch.signbit(x),
        *torch.aminmax(x, dim=1),
    ),
}  # fmt: skip


def with_gradient(fn):
    """fn's outputs and the gradient of their sum with respect to its input."""

    def call(on):
        x = on(torch.randn(*IMAGE, dtype=torch.float64)).requires_grad_()
        outputs = fn(x)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        total = sum(output.sum() for output in outputs)
        (grad,) = torch.autograd.grad(total, x)
        return *(output.detach() for output in outputs), grad

    return call


@pytest.mark.parametrize("name", sorted(CALLS))
def test_an_everyday_op_and_its_backward_match_eager_unboxed(placement, name):
    actual, expected = run_both(with_gradient(CALLS[name]))
    assert_same(actual, expected)
    assert_served_as_placed(served_unboxed(placement), name)


@pytest.mark.parametrize("name", sorted(INTEGER_CALLS))
def test_an_everyday_op_with_exact_results_matches_eager_unboxed(placement, name):
    actual, expected = run_both(
        lambda on: INTEGER_CALLS[name](on(torch.randn(*IMAGE, dtype=torch.float64)))
    )
    assert_same(actual, expected)
    assert_served_as_placed(served_unboxed(placement), name)


# name -> a draw from a (2, 50) tensor of probabilities and a generator (None: the default)
RANDOM_DRAWS = {
    "multinomial": lambda p, g: torch.multinomial(p, 4, generator=g),
    "normal_": lambda p, g: torch.empty_like(p).normal_(0.5, 2.0, generator=g),
    "uniform_": lambda p, g: torch.empty_like(p).uniform_(-1.0, 3.0, generator=g),
    "bernoulli": lambda p, g: torch.bernoulli(p, generator=g),
    "bernoulli_": lambda p, g: torch.empty_like(p).bernoulli_(0.3, generator=g),
    "exponential_": lambda p, g: torch.empty_like(p).exponential_(generator=g),
    "random_": lambda p, g: torch.empty_like(p).random_(generator=g),
    "random_ to": lambda p, g: torch.empty_like(p).random_(10, generator=g),
    "random_ from to": lambda p, g: torch.empty_like(p, dtype=torch.long).random_(
        -5, 5, generator=g
    ),
}


@pytest.mark.parametrize("generator", ["default", "seeded"])
@pytest.mark.parametrize("name", sorted(RANDOM_DRAWS))
def test_a_random_draw_equals_eagers_on_the_target_unboxed(placement, name, generator):
    # relay's generators draw from the target's: the same numbers as eager there,
    # whichever engine serves the call.
    def draw(device: str) -> torch.Tensor:
        torch.manual_seed(0)
        probabilities = torch.rand(2, 50).to(device)
        seeded = torch.Generator(device).manual_seed(7) if generator == "seeded" else None
        return RANDOM_DRAWS[name](probabilities, seeded)

    expected = draw(placement.target)
    actual = draw("relay")
    assert actual.device.type == "relay" and actual.dtype == expected.dtype
    assert torch.equal(actual.cpu(), expected.cpu())
    assert_served_as_placed(served_unboxed(placement), name)


def test_a_generator_of_another_device_is_refused_as_eager_refuses_it(placement):
    with pytest.raises(RuntimeError, match="Expected a 'relay' device type for generator"):
        torch.empty(3, device="relay").uniform_(generator=torch.Generator())
