"""The native backend's C kernels on every path this host can run (AVX-512, AVX2, portable):
built here, equal to the PyTorch operations they replace, and row-invariant; without a compiler,
or with a source that does not build, the PyTorch ones serve and the plan says why."""

import shutil
import threading

import pytest
import torch

from specdecode.models.native import plan
from specdecode.models.native.kernels import CKernels, TorchKernels, make_kernels, tree_keys
from specdecode.models.native.linear import F32Linear, Int4Linear, Q8Linear
from specdecode.models.native.source import Groups4
from quantized import k_groups, q4_grid, q6k_groups

H, HKV, HD = 9, 3, 64  # SmolLM2's attention shape
C_PATHS = [p for p in plan.runnable_paths() if p != "torch"]


@pytest.fixture(scope="module", params=C_PATHS)
def lib(request):
    """The C kernels built for one path (each runnable path in turn: an AVX-512 host tests AVX2 too)."""
    compiler = plan.c_compiler()
    assert compiler is not None, "no C compiler on this machine"
    built, isa, _ = plan._load(request.param, compiler)
    assert isa in plan._expected_isa(request.param)
    return built


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_pytorch_and_each_row_is_computed_alone(lib, dtype):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(13, 576, generator=gen) * 3).to(dtype)
    weight = torch.randn(576, generator=gen).to(dtype)
    ours = CKernels(lib, H, HKV, HD, dtype).rms_norm(x, weight, 1e-5)
    reference = TorchKernels.rms_norm(x, weight, 1e-5)
    if dtype == torch.float32:
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)
    else:  # the same float32 math, rounded twice to bf16: at most one bf16 step apart
        assert ((ours.float() - reference.float()).abs() <= reference.float().abs() * 2 ** -7 + 1e-6).all()
    alone = torch.cat([CKernels(lib, H, HKV, HD, dtype).rms_norm(x[i : i + 1], weight, 1e-5) for i in range(13)])
    assert torch.equal(ours, alone)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_equals_pytorch_and_each_row_is_computed_alone(lib, dtype):
    gen = torch.Generator().manual_seed(6)
    gate_up = (torch.randn(9, 2 * 1544, generator=gen) * 4).to(dtype)  # 1544: 96 vectors of 16 and a tail of 8
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # exp's range limits
    ours = CKernels(lib, H, HKV, HD, dtype).silu_mul(gate_up)
    reference = TorchKernels.silu_mul(gate_up.float())  # silu(gate) * up in float32
    assert ours.shape == (9, 1544) and ours.dtype == dtype
    torch.testing.assert_close(ours.float(), reference, rtol=1e-5 if dtype == torch.float32 else 2 ** -8,
                               atol=1e-6)
    alone = torch.cat([CKernels(lib, H, HKV, HD, dtype).silu_mul(gate_up[i : i + 1]) for i in range(9)])
    assert torch.equal(ours, alone)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_mul_equals_pytorch_and_each_row_is_computed_alone(lib, dtype):
    """Gemma's activation, gelu's tanh approximation computed as x sigmoid(2 u) (the same function)."""
    gen = torch.Generator().manual_seed(11)
    gate_up = (torch.randn(9, 2 * 1544, generator=gen) * 4).to(dtype)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # exp's range limits
    ours = CKernels(lib, H, HKV, HD, dtype).gelu_mul(gate_up)
    # in float64: PyTorch's float32 0.5 x (1 + tanh(u)) cancels to 0 where the kernel's x sigmoid(2 u) does not
    reference = TorchKernels.gelu_mul(gate_up.double())
    assert ours.shape == (9, 1544) and ours.dtype == dtype
    torch.testing.assert_close(ours.double(), reference, rtol=1e-5 if dtype == torch.float32 else 2 ** -8,
                               atol=1e-6)
    alone = torch.cat([CKernels(lib, H, HKV, HD, dtype).gelu_mul(gate_up[i : i + 1]) for i in range(9)])
    assert torch.equal(ours, alone)


@pytest.mark.parametrize("window", [1, 5, 40])
def test_a_sliding_window_sees_the_last_keys_exactly_as_a_call_over_those_keys_alone(lib, window):
    """With a window, each position of a chain or a draft tree (one deeper than the window too)
    attends to the last `window` of its keys: the same bits as a call given only those keys, and
    PyTorch's attention over them within float32 rounding."""
    gen = torch.Generator().manual_seed(window)
    keys, values = (torch.randn(HKV, 64, HD, generator=gen) for _ in range(2))
    q = torch.randn(7, H, HD, generator=gen)
    ours, one = CKernels(lib, H, HKV, HD, torch.float32), CKernels(lib, H, HKV, HD, torch.float32)
    for parents in (None, torch.tensor([-1, 0, 1, 2, 3, 4, 1], dtype=torch.int32)):  # a 6-deep path and a branch
        batch = ours.attend(q, keys, values, 30, parents, window)
        reference = TorchKernels(H, HKV, HD).attend(q, keys, values, 30, parents, window)
        torch.testing.assert_close(batch, reference, rtol=1e-5, atol=1e-5)
        for t in range(7):
            seen = torch.arange(31 + t) if parents is None else tree_keys(parents, t, 30)
            seen = seen[-window:]
            alone = one.attend(q[t : t + 1], keys[:, seen], values[:, seen], len(seen) - 1)
            assert torch.equal(batch[t], alone[0]), (parents, t)
    # a window as long as every query's keys (at most 37 here) changes nothing
    unwindowed = ours.attend(q, keys, values, 30)
    assert torch.equal(ours.attend(q, keys, values, 30, None, window), unwindowed) == (window >= 37)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p0", [0, 37, 300])
def test_attention_equals_pytorch_and_a_position_attends_alone_as_in_a_batch(lib, dtype, p0):
    gen = torch.Generator().manual_seed(p0)
    keys = torch.randn(HKV, 512, HD, generator=gen).to(dtype)  # one layer of a cache, positions past p0 + T unused
    values = torch.randn(HKV, 512, HD, generator=gen).to(dtype)
    q = torch.randn(8, H, HD, generator=gen).to(dtype)
    ours = CKernels(lib, H, HKV, HD, dtype)
    batch = ours.attend(q, keys, values, p0)
    assert batch.shape == (8, H * HD) and batch.dtype == dtype
    reference = TorchKernels(H, HKV, HD).attend(q.float(), keys.float(), values.float(), p0)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(batch.float(), reference, rtol=tolerance, atol=tolerance)
    alone = torch.cat([ours.attend(q[t : t + 1], keys, values, p0 + t) for t in range(8)])
    assert torch.equal(batch, alone)
    # a later position sees more keys: changing a key it alone sees changes only its row
    keys[:, p0 + 7] += 1
    changed = ours.attend(q, keys, values, p0)
    assert torch.equal(changed[:7], batch[:7]) and not torch.equal(changed[7], batch[7])


@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (8, 2), (8, 4), (12, 3), (7, 1), (4, 4)])
def test_attention_of_every_gqa_group_shape_is_each_heads_alone_in_a_chain_or_a_tree(lib, heads, kv_heads):
    """A call over several positions may take a GQA group's heads together (keys and values read once
    for them); every head and position must come out as it does alone, a draft tree's nodes too."""
    gen = torch.Generator().manual_seed(heads * 10 + kv_heads)
    keys, values = (torch.randn(kv_heads, 64, HD, generator=gen) for _ in range(2))
    q = torch.randn(6, heads, HD, generator=gen)
    ours = CKernels(lib, heads, kv_heads, HD, torch.float32)
    reference = TorchKernels(heads, kv_heads, HD)
    for parents in (None, torch.tensor([-1, 0, 0, 1, -1, 4], dtype=torch.int32)):
        batch = ours.attend(q, keys, values, 40, parents)
        torch.testing.assert_close(batch, reference.attend(q, keys, values, 40, parents), rtol=1e-5, atol=1e-5)
        for h in range(heads):  # one head, one position at a time: a call of its own
            one = CKernels(lib, 1, 1, HD, torch.float32)
            kv = h // (heads // kv_heads)
            for t in range(6):
                if parents is None:
                    alone = one.attend(q[t : t + 1, h : h + 1], keys[kv : kv + 1], values[kv : kv + 1], 40 + t)
                else:  # the node's path as a chain: the cache's first 40 keys, then its ancestors' and its own
                    path, node = [], t
                    while node >= 0:
                        path.insert(0, 40 + node)
                        node = int(parents[node])
                    seen = torch.tensor(list(range(40)) + path)
                    alone = one.attend(q[t : t + 1, h : h + 1], keys[kv : kv + 1, seen], values[kv : kv + 1, seen],
                                       len(seen) - 1)
                assert torch.equal(batch[t, h * HD : (h + 1) * HD], alone[0]), (h, t)


def test_without_a_compiler_pytorch_ops_serve_and_the_plan_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    monkeypatch.delenv(plan.ENV, raising=False)
    plan.clear()
    try:
        with pytest.warns(RuntimeWarning, match="running PyTorch ops"):
            kernels = make_kernels(H, HKV, HD, 576, torch.bfloat16)
        assert type(kernels) is TorchKernels and kernels.plan.path == "torch"
        assert "no-such-compiler" in kernels.plan.reason
        monkeypatch.setenv(plan.ENV, C_PATHS[-1])  # a forced path that cannot be built is an error, not a fallback
        with pytest.raises(plan.BuildError, match="could not build csrc/"):
            make_kernels(H, HKV, HD, 576, torch.bfloat16)
    finally:
        monkeypatch.undo()
        plan.clear()
    assert type(make_kernels(H, HKV, HD, 576, torch.bfloat16)) is CKernels
    assert type(make_kernels(H, HKV, 20, 580, torch.bfloat16)) is TorchKernels  # a head_dim the C code does not take
    assert type(make_kernels(H, HKV, 48, 576, torch.bfloat16)) is TorchKernels  # nor 48: the bf16 dot product takes 32


@pytest.mark.slow  # builds the kernels afresh
def test_a_kernel_source_that_does_not_build_falls_back_with_the_compilers_message(monkeypatch, tmp_path):
    broken = tmp_path / "csrc"
    shutil.copytree(plan.CSRC, broken)
    (broken / "attend.c").write_text((plan.CSRC / "attend.c").read_text() + "\nthis line is not C;\n")
    monkeypatch.setattr(plan, "CSRC", broken)
    monkeypatch.setattr(plan, "runnable_paths", lambda: ["portable", "torch"])  # one C path to fail is enough
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    monkeypatch.delenv(plan.ENV, raising=False)
    plan.clear()
    try:
        with pytest.warns(RuntimeWarning, match="running PyTorch ops"):
            kernels = make_kernels(H, HKV, HD, 576, torch.float32)
        assert type(kernels) is TorchKernels and "could not build csrc/attend.c" in kernels.plan.reason
        assert "error" in kernels.plan.reason  # the compiler's own words
    finally:
        monkeypatch.undo()
        plan.clear()


def test_an_unknown_or_unrunnable_path_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(plan.ENV, "avx9000")
    with pytest.raises(ValueError, match="not a kernel path; choose one of auto, avx512, avx2, neon, portable, torch"):
        plan.kernel_plan()
    for path in ("avx512", "neon"):
        if path not in plan.runnable_paths():
            monkeypatch.setenv(plan.ENV, path)
            with pytest.raises(plan.BuildError, match=f"cannot run the {path} path"):
                plan.kernel_plan()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_and_cache_writes_equal_pytorch_and_each_row_is_computed_alone(lib, dtype):
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(6, (H + 2 * HKV) * HD, generator=gen).to(dtype)
    angles = torch.rand(6, HD // 2, generator=gen) * 10
    cos, sin = torch.cat([angles, angles], -1).cos().to(dtype), torch.cat([angles, angles], -1).sin().to(dtype)
    caches = {name: (torch.zeros(HKV, 64, HD, dtype=dtype), torch.zeros(HKV, 64, HD, dtype=dtype))
              for name in ("c", "torch", "alone")}
    ours = CKernels(lib, H, HKV, HD, dtype)
    q = ours.rope_store(qkv, cos, sin, *caches["c"], 20)
    q_ref = TorchKernels(H, HKV, HD).rope_store(qkv, cos, sin, *caches["torch"], 20)
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2  # PyTorch rounds each bf16 op, the kernel once
    torch.testing.assert_close(q, q_ref.float(), rtol=tolerance, atol=tolerance)
    for ours_cache, reference_cache in zip(caches["c"], caches["torch"]):
        torch.testing.assert_close(ours_cache.float(), reference_cache.float(), rtol=tolerance, atol=tolerance)
        assert ours_cache[:, :20].abs().sum() == 0 and ours_cache[:, 26:].abs().sum() == 0  # only positions 20..25
    alone = torch.cat([ours.rope_store(qkv[t : t + 1], cos[t : t + 1], sin[t : t + 1], *caches["alone"], 20 + t)
                       for t in range(6)])
    assert torch.equal(alone, q) and all(torch.equal(a, b) for a, b in zip(caches["alone"], caches["c"]))


def test_q8_head_reads_a_q8_grid_exactly_rows_alone_as_in_a_batch(lib):
    gen = torch.Generator().manual_seed(4)
    q = torch.randint(-127, 128, (96, 576 // 32, 32), generator=gen).float()
    q[..., 0] = 127  # Q8_0 maps each group's largest magnitude to +-127
    weight = (q * (torch.rand(96, 576 // 32, 1, generator=gen) * 0.01 + 1e-4)).view(96, 576)
    ours = CKernels(lib, H, HKV, HD, torch.bfloat16)
    head = Q8Linear.quantize(weight, ours)
    assert head is not None and head.out_features == 96
    x = torch.randn(11, 576, generator=gen)
    y = head(x)
    torch.testing.assert_close(y, x @ weight.t(), rtol=1e-5, atol=1e-5)
    alone = torch.cat([head(x[i : i + 1]) for i in range(11)])
    assert torch.equal(y, alone) and all(torch.equal(head(x[:rows]), y[:rows]) for rows in (2, 4, 5, 8))
    assert Q8Linear.quantize(torch.randn(96, 576, generator=gen), ours) is None  # not an 8-bit grid
    assert Q8Linear.quantize(weight, TorchKernels(H, HKV, HD)) is None  # no C kernels: the head stays bf16


def test_q4_product_reads_a_q4_grid_exactly_rows_alone_as_in_a_batch(lib):
    """The C kernels' 4-bit product with bf16 activations (AVX512-BF16): the Q4_1 grid's values, each row
    computed alone."""
    ours = CKernels(lib, H, HKV, HD, torch.bfloat16)
    if not ours.q4:
        pytest.skip("this build has no AVX512-BF16: the float32 4-bit product serves (tested below)")
    gen = torch.Generator().manual_seed(5)
    for out_features, in_features in ((96, 1536), (960, 576)):
        weight = q4_grid(out_features, in_features, gen)
        linear = Int4Linear.quantize(weight, torch.bfloat16, ours)
        assert linear.kernels is ours and linear.out_features == out_features
        # x = I reads each weight back, rounded once to bf16
        read = linear(torch.eye(in_features, dtype=torch.bfloat16)).float()
        torch.testing.assert_close(read, weight.t(), rtol=2 ** -8, atol=1e-6)
        x = torch.randn(16, in_features, generator=gen).bfloat16()
        y = linear(x)
        assert y.dtype == torch.bfloat16
        torch.testing.assert_close(y.float(), x.float() @ weight.t(), rtol=2 ** -7, atol=2e-2)
        alone = torch.cat([linear(x[i : i + 1]) for i in range(16)])
        assert torch.equal(y, alone) and all(torch.equal(linear(x[:rows]), y[:rows]) for rows in range(2, 16))
    assert Int4Linear.quantize(q4_grid(40, 576, gen), torch.bfloat16, ours) is None  # outputs not a multiple of 16


def test_float32_q4_product_reads_a_q4_grid_exactly_rows_alone_as_in_a_batch(lib):
    """The 4-bit product with float32 activations (every C build): the grid read back exactly, the
    product within float32 rounding, every row the same alone and in batches of 2..16."""
    ours = CKernels(lib, H, HKV, HD, torch.float32)
    gen = torch.Generator().manual_seed(7)
    for out_features, in_features in ((96, 1536), (960, 576)):
        weight = q4_grid(out_features, in_features, gen)
        linear = Int4Linear.quantize(weight, torch.float32, ours)
        assert linear.kind == "q4f" and linear.out_features == out_features
        torch.testing.assert_close(linear(torch.eye(in_features)), weight.t(), rtol=0, atol=1e-6)
        x = torch.randn(16, in_features, generator=gen)
        y = linear(x)
        torch.testing.assert_close(y, x @ weight.t(), rtol=1e-5, atol=1e-4)
        alone = torch.cat([linear(x[i : i + 1]) for i in range(16)])
        assert torch.equal(y, alone) and all(torch.equal(linear(x[:rows]), y[:rows]) for rows in range(2, 16))
    assert Int4Linear.quantize(q4_grid(40, 576, gen), torch.float32, ours) is None


def test_float32_product_rows_alone_as_in_a_batch(lib):
    """Float32 weights through f32_matmul: within float32 rounding of x @ W^T, and each row's result
    independent of the row count (a BLAS call's is not)."""
    ours = CKernels(lib, H, HKV, HD, torch.float32)
    gen = torch.Generator().manual_seed(8)
    weight = torch.randn(96, 1536, generator=gen) * 0.05
    linear = F32Linear(weight, ours)
    x = torch.randn(16, 1536, generator=gen)
    y = linear(x)
    torch.testing.assert_close(y, x @ weight.t(), rtol=1e-5, atol=1e-4)
    alone = torch.cat([linear(x[i : i + 1]) for i in range(16)])
    assert torch.equal(y, alone) and all(torch.equal(linear(x[:rows]), y[:rows]) for rows in range(2, 16))


def test_every_c_path_computes_the_same_function(lib):
    """The paths differ in instructions, not in what they compute: each agrees with the portable build
    within float32 rounding."""
    portable, _, _ = plan._load("portable", plan.c_compiler())
    gen = torch.Generator().manual_seed(9)
    weight = q4_grid(96, 576, gen)
    x = torch.randn(5, 576, generator=gen)
    ours = Int4Linear.quantize(weight, torch.float32, CKernels(lib, H, HKV, HD, torch.float32))(x)
    reference = Int4Linear.quantize(weight, torch.float32, CKernels(portable, H, HKV, HD, torch.float32))(x)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


def _quantisation_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """How far x W^T can move when x is rounded to 8 bits per group of 32 (each x_i by at most half
    its group's step max|x| / 127): sum over groups of step / 2 * sum |w_i|, [rows, out]."""
    rows, K = x.shape
    step = x.view(rows, K // 32, 32).abs().amax(-1) / 127  # [rows, groups]
    weight_mass = weight.abs().view(weight.shape[0], K // 32, 32).sum(-1)  # [out, groups]
    return step / 2 @ weight_mass.t() * 1.001 + 1e-5


@pytest.mark.parametrize("product", ["q4q8", "q40q8", "q5q8", "q4kq8", "q5kq8", "q8q8", "q6q8", "q6kq8"])
def test_int8_activation_products_give_the_portable_bits_rows_alone_within_the_rounding_bound(lib, product):
    """The integer products (activations rounded to 8 bits per group of 32, exact integer dot
    products): the same bits as the portable build's, each row the same alone and in batches, and
    the result within the activations' rounding of x W^T (a misplaced nibble or scale would not be)."""
    ours, reference = (CKernels(built, H, HKV, HD, torch.float32)
                       for built in (lib, plan._load("portable", plan.c_compiler())[0]))
    gen = torch.Generator().manual_seed(10)
    for out_features, in_features in ((96, 1536), (960, 576 if product in ("q4q8", "q40q8", "q5q8", "q8q8") else 512)):  # K: 256s
        if product == "q4q8":
            weight = q4_grid(out_features, in_features, gen)
            make = lambda k: Int4Linear.quantize(weight, torch.float32, k, int8_activations=True)  # noqa: E731
        elif product == "q40q8":  # Q4_0's groups: float16 d a group, m = -8 d
            d = (torch.rand(out_features, in_features // 32, generator=gen) * 0.01 + 1e-3).half()
            groups = Groups4(torch.randint(0, 16, (out_features, in_features), generator=gen).to(torch.uint8), d,
                             d * -8)
            weight = groups.dense()
            make = lambda k: Int4Linear.from_groups(groups, torch.float32, k, int8_activations=True)  # noqa: E731
        elif product == "q5q8":  # Q5_1's groups: 5-bit values, float16 d and m a group
            groups = Groups4(torch.randint(0, 32, (out_features, in_features), generator=gen).to(torch.uint8),
                             (torch.rand(out_features, in_features // 32, generator=gen) * 0.01 + 1e-3).half(),
                             (-torch.rand(out_features, in_features // 32, generator=gen) * 0.05).half())
            weight = groups.dense()
            make = lambda k: Int4Linear.from_groups(groups, torch.float32, k, int8_activations=True)  # noqa: E731
        elif product in ("q4kq8", "q5kq8"):  # Q4_K's, Q5_K's groups: d sc and -dmin m from the file's fields
            groups = k_groups(out_features, in_features, gen, bits=4 if product == "q4kq8" else 5)
            weight = groups.dense()
            make = lambda k: Int4Linear.from_k_quant(groups, k)  # noqa: E731
        elif product in ("q6q8", "q6kq8"):  # Q6_K's: q - 32 in -32..31, a scale d sc a 16 inputs; int8 or 6 bits
            groups = q6k_groups(out_features, in_features, gen)
            weight = groups.dense()

            def make(k, packed=product == "q6kq8"):
                k.q6k_packed = packed
                return Q8Linear.from_groups(groups, k, int8_activations=True)
        else:
            q = torch.randint(-127, 128, (out_features, in_features // 32, 32), generator=gen).float()
            q[..., 0] = 127
            weight = (q * (torch.rand(out_features, in_features // 32, 1, generator=gen) * 0.01 + 1e-4)).view(
                out_features, in_features)
            make = lambda k: Q8Linear.quantize(weight, k, int8_activations=True)  # noqa: E731
        linear = make(ours)
        assert linear.kind == product and linear.out_features == out_features
        x = torch.randn(16, in_features, generator=gen) * torch.rand(16, 1, generator=gen) * 4
        x[0, :32] = 0  # an all-zero group: step 0
        y = linear(x)
        assert torch.equal(y, make(reference)(x))
        assert ((y - x @ weight.t()).abs() <= _quantisation_bound(x, weight)).all()
        alone = torch.cat([linear(x[i : i + 1]) for i in range(16)])
        assert torch.equal(y, alone) and all(torch.equal(linear(x[:rows]), y[:rows]) for rows in range(2, 16))
        if product == "q6kq8":  # the same integers as from the int8 layout, and the same rows read back
            as_int8, ids = make(ours, packed=False), torch.randint(0, out_features, (20,), generator=gen)
            assert torch.equal(y, as_int8(x)) and torch.equal(linear.rows(ids), as_int8.rows(ids))
            assert torch.equal(linear.rows(ids), weight[ids])
    with pytest.raises(ValueError, match="8-bit activations need the C kernels"):
        Int4Linear.quantize(q4_grid(96, 576, gen), torch.float32, TorchKernels(H, HKV, HD), int8_activations=True)


def test_the_clis_kernel_choices_are_the_plans_paths(capsys):
    from specdecode.cli import build_parser

    choices = "--kernels {" + ",".join(["auto", *plan.PATHS]) + "}"
    for command in (["generate"], ["info"], ["alpha"], ["profile"], ["bench"], ["serve"], ["ngram", "fit"],
                    ["distill"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*command, "--help"])
        assert choices in " ".join(capsys.readouterr().out.split()), command


def test_the_pool_runs_calls_from_any_thread_with_the_same_results(lib):
    """One pool of threads - 1 workers per process, whichever thread calls (a server decodes on its
    own thread): calls from another thread, and with one thread or two, give the same bits."""
    gen = torch.Generator().manual_seed(11)
    weight = q4_grid(960, 576, gen)
    x = torch.randn(5, 576, generator=gen)
    q = torch.randn(4, H, HD, generator=gen)
    keys, values = torch.randn(HKV, 64, HD, generator=gen), torch.randn(HKV, 64, HD, generator=gen)

    def results(threads: int) -> list[torch.Tensor]:
        kernels = CKernels(lib, H, HKV, HD, torch.float32, threads=threads)
        products = [Int4Linear.quantize(weight, torch.float32, kernels, int8_activations=int8) for int8 in (False, True)]
        return [p(x) for p in products for _ in range(3)] + [kernels.attend(q, keys, values, 30)]  # workers reused

    here = results(2)
    elsewhere = {}
    thread = threading.Thread(target=lambda: elsewhere.update(two=results(2), one=results(1)))
    thread.start()
    thread.join()
    for ours in (elsewhere["two"], elsewhere["one"], results(1)):
        assert all(torch.equal(a, b) for a, b in zip(ours, here))
    assert lib.kernels_pool_workers() == 1  # one worker beside the calling thread, shared by every caller


@pytest.mark.skipif(shutil.which("clang") is None, reason="no clang here (Debian: apt-get install clang; "
                    "`make setup` installs it where apt-get runs as root)")
def test_clang_builds_every_path_with_the_same_integer_products(lib):
    """The library builds with clang too (as on macOS), and its integer products give gcc's bits."""
    compiler = plan.c_compiler()
    path = next(p for p in C_PATHS if plan._load(p, compiler)[0] is lib)
    built, isa, _ = plan._load(path, "clang")
    assert isa in plan._expected_isa(path)
    gen = torch.Generator().manual_seed(12)
    weight = q4_grid(960, 576, gen)
    x = torch.randn(6, 576, generator=gen)
    theirs, ours = (Int4Linear.quantize(weight, torch.float32, CKernels(b, H, HKV, HD, torch.float32, threads=2),
                                        int8_activations=True) for b in (built, lib))
    assert torch.equal(theirs(x), ours(x)) and torch.equal(theirs(x[2:3]), ours(x)[2:3])


def test_the_format_table_and_the_layer_slots_name_what_the_library_runs(lib):
    """The product ids and layer slots the Python side uses come from the library (kernels.h's
    PRODUCT_KINDS and LAYER_SLOTS); every product a format's groups run on is one of them, and the
    ctypes struct has the C struct's size (checked at load, `plan._bind`)."""
    import ctypes

    from specdecode.models.native.linear import StackedLinear
    from specdecode.models.native.plan import DecodeModel
    from specdecode.models.native.source import FORMATS

    kernels = CKernels(lib, H, HKV, HD, torch.float32)
    assert sorted(kernels.products.values()) == list(range(len(kernels.products)))  # ids 0.. in the enum's order
    assert {p for fmt in FORMATS.values() for p in fmt.products} | {"f32", StackedLinear.kind} <= set(kernels.products)
    assert kernels.slots[:2] == ["attn_norm", "mlp_norm"] and len(kernels.slots) == len(set(kernels.slots)) == 15
    assert lib.decode_model_bytes() == ctypes.sizeof(DecodeModel)


def test_each_format_reads_the_values_gguf_dequantises(tmp_path):
    """Every block type of the table reads as its groups hold exactly what the `gguf` package
    dequantises from the same bytes."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize, quantize

    from specdecode.models.native.source import FORMATS, as_float

    weights = torch.randn(16, 512, generator=torch.Generator().manual_seed(3)).numpy()
    for name, fmt in FORMATS.items():
        try:
            data = quantize(weights, T[name])
        except NotImplementedError:  # gguf-py has no quantiser for this type: llama.cpp-made files cover it
            continue
        read = as_float(fmt.read(data.reshape(16, -1, fmt.block_bytes))).float()
        assert torch.equal(read, torch.from_numpy(dequantize(data, T[name])).float()), name
