"""The live layer vs a fresh computation (nrl_shim/probe/live.py, check d) on torch layers: a kernel that computes
from a copy of older weights is named, one that computes from its parameter is not (float32 and bfloat16), and the
WeightsProbe runs it once per refit that ended. On real engines: tests/test_vllm_weights_probe.py."""

import pytest

torch = pytest.importorskip("torch")

from nrl_shim.probe import live  # noqa: E402
from nrl_shim.probe.weights import WeightsProbe  # noqa: E402


class PackedLinear(torch.nn.Linear):
    """A layer as an engine lays it out: its kernel computes from a copy taken at load (a packed handle)."""

    def __init__(self, dtype=torch.float32):
        super().__init__(16, 8, dtype=dtype)
        self.pack()

    def pack(self):
        self.packed = self.weight.detach().clone()

    def kernel(self, x):
        return torch.nn.functional.linear(x, self.packed, self.bias)


def layers(model):
    return [(name, m.kernel, m.weight, m.bias) for name, m in model.named_modules() if isinstance(m, PackedLinear)]


def refit(layer):
    with torch.no_grad():
        layer.weight.add_(torch.randn(layer.weight.shape, generator=torch.Generator().manual_seed(3)).to(layer.weight))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_kernel_on_a_copy_of_older_weights_is_named_and_a_rebuilt_one_is_not(dtype):
    layer = PackedLinear(dtype)
    finding, gap = live.check(layers(torch.nn.ModuleDict({"head": layer})), refit=1)
    assert finding is None and gap == 0.0
    refit(layer)  # the parameter written, the packed copy left as it was
    finding, gap = live.check(layers(torch.nn.ModuleDict({"head": layer})), refit=2)
    assert finding is not None and finding.check == "live layer vs a fresh load", finding
    assert "after refit 2, 1 layer(s)" in finding.what and "head (" in finding.what
    assert gap > 5 * live.TOLERANCE[str(dtype)], gap
    layer.pack()  # rebuilt after the refit
    assert live.check(layers(torch.nn.ModuleDict({"head": layer})), refit=3)[0] is None


def test_bfloat16_kernel_rounding_is_below_its_tolerance():
    # A blocked kernel that rounds its partial sums to bf16 (two halves of the inner dimension) against torch's bf16
    # product (one float32 accumulation): the rounding noise bf16 kernels differ by.
    layer = PackedLinear(torch.bfloat16)
    w, b = layer.weight, layer.bias

    def kernel(x):
        first = torch.nn.functional.linear(x[:, :8], w[:, :8])
        return first + torch.nn.functional.linear(x[:, 8:], w[:, 8:]) + b

    finding, gap = live.check([("head", kernel, layer.weight, layer.bias)], refit=1)
    assert finding is None and 0 < gap < live.TOLERANCE["torch.bfloat16"], gap


def test_kernels_that_fail_and_dtypes_without_measured_noise_are_not_compared():
    layer = PackedLinear()
    refit(layer)

    def broken(x):
        raise TypeError("takes other inputs")

    int_weight = torch.zeros(8, 16, dtype=torch.int8)
    finding, gap = live.check([("a", broken, layer.weight, None), ("b", layer.kernel, int_weight, None)], refit=1)
    assert finding is None and gap == 0.0


def test_the_weights_probe_checks_the_live_layers_once_per_refit_that_ended():
    model = torch.nn.ModuleDict({"head": PackedLinear()})
    probe = WeightsProbe(model, "test", {"model": "m"}, live_layers=layers)
    assert probe.live_done() is None and probe.live_gap is None  # no refit yet
    probe.refit_starts()
    refit(model["head"])
    assert probe.refit_done() is None  # the weights changed: a refit of a policy in training
    finding = probe.live_done()
    assert finding is not None and probe.record()["live_gap"] == probe.live_gap > 0
    assert probe.live_done() is None  # once per refit
