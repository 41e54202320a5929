#!/usr/bin/env python3
"""tests/reference/generate.py: the reference suite, computed by PyTorch.

Runs PyTorch over every public op of include/ember.h that has a PyTorch counterpart and writes,
for each case, its inputs, outputs and input gradients (for a stored upstream gradient) as .npy
files under data/, and one manifest.json that tests/test_reference.c replays in eager mode and
compiled (aot_eager, inductor), on the CPU and on CUDA.

Only needed to regenerate (Debian's python3-torch and python3-numpy; run with /usr/bin/python3):
    /usr/bin/python3 tests/reference/generate.py
    /usr/bin/python3 tests/reference/generate.py --with-pending DIR  (PENDING_OPS cases too, into DIR)
The output is byte for byte the same on every run: fixed seeds (one per case and input, from
its name, so adding a case changes no other), one thread, deterministic algorithms, and files
written in a fixed order with fixed formatting. Check with `generate.py --check`, which
regenerates into a temporary directory and compares.

Adding a case is one line in the tables below: case(op, tag, [inputs], **args). An op is a row
of OPS: the PyTorch function that defines it (called with the inputs by role, then the args),
its input roles, and its tolerance class. The C side has the same row in its op table.

Manifest (one case a line, in a JSON array "cases"):
  id       "<op>.<tag>", unique
  op       Ember op name (em_<op>; see the op table of tests/test_reference.c)
  args     the op's non-tensor arguments, by name; doubles that are not finite are the strings
           "inf", "-inf", "nan"; dtypes are strings "f32", "f64", "i32", "i64", "bool"
  inputs   [{name: role, file, view: [...], grad: bool}]: the file holds the contiguous base; the
           op's input is the base after the view steps, in order: ["transpose", d0, d1],
           ["slice", axis, start, stop, step], ["expand", [sizes]], ["permute", [perm]].
           grad: the view (made a leaf) requires grad, and its gradient is stored.
  outputs  [{file, grad_out: file or null}]: expected values; grad_out is the upstream gradient
           of that output (null: the output is not differentiable in PyTorch)
  grads    [file or null per input]: d(sum of outputs . grad_out)/d(input)
  tol      {"out": [rtol, atol], "grad": [rtol, atol]}: |got - want| <= atol + rtol |want|
           (integer and bool results are compared exactly; NaN matches NaN)
  expect_error  absent, or why Ember refuses this case with an error (the test requires it)
  expect_error_device  absent (everywhere), or the one device where Ember refuses it ("cuda")
Files are data/<first 16 hex digits of the SHA-1 of their bytes>.npy, so equal arrays (inputs
drawn from one spec, upstream gradients of one shape) are stored once.
"""
import hashlib
import io
import json
import math
import os
import shutil
import sys
import tempfile
import zlib

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

# Features whose C side is being written on other branches. Their cases are below, ready, but
# are not written to the manifest until the name is removed from this list (after the merge);
# a case names its feature with case(...).
# Enabled since: round, trunc, frac, clamp_tensor, zero gradients of sign/floor/ceil, 0-dim type
# promotion, prod's gradient at zeros, logsumexp over size-0 dims (features of "parity", merged);
# add/sub alpha, div rounding_mode, negative pads, squeeze of a dim that is not 1, embedding
# padding_idx, pool options, class weights of the losses, cumsum, cumprod, sort, topk, tril, triu,
# split, chunk, multinomial, clip_grad_norm_ (issue 21, merged).
PENDING_OPS = []

DTYPES = {"f32": torch.float32, "f64": torch.float64, "i32": torch.int32, "i64": torch.int64,
          "bool": torch.bool}
FLOAT = ("f32", "f64")

# ---- tolerances: |got - want| <= atol + rtol |want|, by class and dtype ----------------------
# exact: movement, indexing, comparisons, selection; arith: one correctly rounded operation (the
# inductor may fuse into FMAs); transc: libm / SLEEF functions (1 to 3.5 ULP); reduce: sums in
# another order, composites; gemm: GEMM and convolution libraries (oneDNN, OpenBLAS vs MKL-DNN).
TOL = {
    "exact": {"f32": (0.0, 0.0), "f64": (0.0, 0.0)},
    "arith": {"f32": (2e-6, 1e-7), "f64": (1e-14, 1e-15)},
    "transc": {"f32": (1e-5, 1e-6), "f64": (1e-12, 1e-14)},
    "reduce": {"f32": (1e-5, 1e-5), "f64": (1e-12, 1e-12)},
    "gemm": {"f32": (1e-4, 1e-5), "f64": (1e-12, 1e-12)},
}
ORDER = ["exact", "arith", "transc", "reduce", "gemm"]


def looser(a, b):
    return a if ORDER.index(a) >= ORDER.index(b) else b


# ---- inputs --------------------------------------------------------------------------------
class In:
    """One input: the op sees `shape`; the stored base and the view recipe make it."""

    def __init__(self, shape, dt="f32", gen="randn", lo=None, hi=None, values=None):
        self.shape, self.dt, self.gen, self.lo, self.hi, self.values = list(shape), dt, gen, lo, hi, values
        self.base, self.view, self.grad = list(shape), [], dt in FLOAT

    def _copy(self):
        c = In(self.shape, self.dt, self.gen, self.lo, self.hi, self.values)
        c.base, c.view, c.grad = list(self.base), list(self.view), self.grad
        return c

    def T(self):
        """A transposed view of the last two dims (the base is stored transposed)."""
        c = self._copy()
        c.base = self.shape[:-2] + [self.shape[-1], self.shape[-2]]
        c.view = [["transpose", -2, -1]]
        return c

    def step(self, axis=-1):
        """A slice with step 2 and a storage offset: base[..., 1:2n+1:2, ...]."""
        c = self._copy()
        a = axis % len(self.shape)
        n = self.shape[a]
        c.base = list(self.shape)
        c.base[a] = 2 * n + 1
        c.view = [["slice", a, 1, 2 * n + 1, 2]]
        return c

    def bcast(self, axis=0):
        """An expanded view: the base has size 1 at axis (stride 0 in the view)."""
        c = self._copy()
        c.base = list(self.shape)
        c.base[axis] = 1
        c.view = [["expand", list(self.shape)]]
        return c

    def nograd(self):
        c = self._copy()
        c.grad = False
        return c


def R(*shape, dt="f32"):
    """Standard normal values."""
    return In(shape, dt)


def P(*shape, dt="f32", lo=0.2, hi=2.0):
    """Uniform in [lo, hi): positive by default."""
    return In(shape, dt, "uniform", lo, hi)


def S(*shape, dt="f32"):
    """Normal values with NaN, inf, -inf, 0 and -0 at the first five positions."""
    return In(shape, dt, "special")


def I(*shape, lo=0, hi=5, dt="i64"):
    """Integers in [lo, hi)."""
    return In(shape, dt, "int", lo, hi)


def B(*shape):
    """Random booleans."""
    return In(shape, "bool", "bool")


def V(values, shape=None, dt="f32"):
    """Given values (row-major)."""
    return In(shape if shape is not None else [len(values)], dt, "values", values=values)


def make_base(inp, g):
    n = int(np.prod(inp.base)) if inp.base else 1
    if inp.gen == "values":
        t = torch.tensor(inp.values, dtype=torch.float64).reshape(inp.base)
    elif inp.gen in ("randn", "special"):
        t = torch.randn(inp.base, generator=g, dtype=torch.float64)
        if inp.gen == "special":
            flat = t.reshape(-1)
            for i, v in enumerate([math.nan, math.inf, -math.inf, 0.0, -0.0][:n]):
                flat[i] = v
    elif inp.gen == "uniform":
        t = torch.rand(inp.base, generator=g, dtype=torch.float64) * (inp.hi - inp.lo) + inp.lo
    elif inp.gen == "int":
        t = torch.randint(inp.lo, inp.hi, inp.base, generator=g, dtype=torch.int64)
    elif inp.gen == "bool":
        t = torch.randint(0, 2, inp.base, generator=g, dtype=torch.int64)
    else:
        raise ValueError(inp.gen)
    return t.to(DTYPES[inp.dt]).contiguous()


def apply_view(t, view):
    for s in view:
        if s[0] == "transpose":
            t = t.transpose(s[1], s[2])
        elif s[0] == "slice":
            t = t[(slice(None),) * s[1] + (slice(s[2], s[3], s[4]),)]
        elif s[0] == "expand":
            t = t.expand(s[1])
        elif s[0] == "permute":
            t = t.permute(s[1])
        else:
            raise ValueError(s)
    return t


# ---- ops: name -> (PyTorch function of (inputs by role, args), input roles, tolerance) --------
class Op:
    def __init__(self, fn, roles=("x",), tol="exact", grad_tol=None):
        self.fn, self.roles, self.tol = fn, roles, tol
        self.grad_tol = grad_tol or looser(tol, "reduce")


def axes_or_all(x, axes):
    return tuple(axes) if axes else tuple(range(x.dim()))


def reduce_fn(f):
    def g(i, a):
        x = i["x"]
        if x.dim() == 0 or not a["axes"]:
            r = f(x)
            return r.reshape([1] * x.dim()) if a["keepdim"] else r
        return f(x, dim=tuple(a["axes"]), keepdim=a["keepdim"])
    return g


def prod(x, dim=None, keepdim=False):
    """torch.prod over several dims (PyTorch's takes one): one dim at a time."""
    if dim is None:
        return torch.prod(x)
    for d in sorted((d % x.dim() for d in dim), reverse=True):
        x = torch.prod(x, d, keepdim=True)
    return x if keepdim else x.reshape([s for k, s in enumerate(x.shape) if k not in [d % x.dim() for d in dim]])


def rms_norm(x, n_norm, w, eps):
    dims = tuple(range(-n_norm, 0))
    y = x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + eps)
    return y * w if w is not None else y


def sdpa(q, k, v, causal, scale):
    s = scale if scale > 0 else 1.0 / math.sqrt(q.shape[-1])
    att = q @ k.transpose(-2, -1) * s
    if causal:
        L, S_ = att.shape[-2], att.shape[-1]
        att = att.masked_fill(torch.ones(L, S_, dtype=torch.bool).tril().logical_not(), -math.inf)
    return torch.softmax(att, -1) @ v


def slice_ix(x, axis, start, stop, step):
    return (slice(None),) * (axis % x.dim()) + (slice(start, stop, step),)


def squeeze(x, axes):
    if not axes:
        return x.squeeze()
    for a in sorted((a % x.dim() for a in axes), reverse=True):
        x = x.squeeze(a)
    return x


def inplace(method):
    def f(i, a):
        d = i["x"].clone()
        other = i.get("b")
        return getattr(d, method)(*([other] if other is not None else []), *([a["s"]] if "s" in a else []))
    return f


def conv_params(a):
    return dict(stride=tuple(a["stride"]), padding=tuple(a["padding"]), dilation=tuple(a["dilation"]),
                groups=a["groups"])


def pool_window(a):
    return (a["kh"], a["kw"]), (a["sh"] or a["kh"], a["sw"] or a["kw"]), (a["ph"], a["pw"])


def long_if_int(t):
    """Ember takes i32 indices where PyTorch wants i64."""
    return t if t.is_floating_point() else t.long()


def batch_norm(i, a):
    rm = i.get("running_mean")
    rv = i.get("running_var")
    rm = rm.clone() if rm is not None else None
    rv = rv.clone() if rv is not None else None
    y = F.batch_norm(i["x"], rm, rv, i.get("weight"), i.get("bias"), a["training"], a["momentum"], a["eps"])
    return (y,) + tuple(t for t in (rm, rv) if t is not None)


RED = {"none": "none", "mean": "mean", "sum": "sum"}
UNARY_TORCH = {
    "neg": (torch.neg, "exact"), "abs": (torch.abs, "exact"), "exp": (torch.exp, "transc"),
    "log": (torch.log, "transc"), "log1p": (torch.log1p, "transc"), "expm1": (torch.expm1, "transc"),
    "sqrt": (torch.sqrt, "arith"), "rsqrt": (torch.rsqrt, "transc"), "sin": (torch.sin, "transc"),
    "cos": (torch.cos, "transc"), "tanh": (torch.tanh, "transc"), "erf": (torch.erf, "transc"),
    "sign": (torch.sign, "exact"), "floor": (torch.floor, "exact"), "ceil": (torch.ceil, "exact"),
    "reciprocal": (torch.reciprocal, "arith"), "logical_not": (torch.logical_not, "exact"),
    "relu": (torch.relu, "exact"), "silu": (F.silu, "transc"), "sigmoid": (torch.sigmoid, "transc"),
    "clone": (torch.clone, "exact"), "contiguous": (lambda x: x.contiguous(), "exact"),
    "round": (torch.round, "exact"), "trunc": (torch.trunc, "exact"), "frac": (torch.frac, "arith"),
}
BINARY_TORCH = {
    "add": (torch.add, "arith"), "sub": (torch.sub, "arith"), "mul": (torch.mul, "arith"),
    "div": (torch.div, "arith"), "pow": (torch.pow, "transc"), "maximum": (torch.maximum, "exact"),
    "minimum": (torch.minimum, "exact"), "remainder": (torch.remainder, "arith"),
    "atan2": (torch.atan2, "transc"), "eq": (torch.eq, "exact"), "ne": (torch.ne, "exact"),
    "lt": (torch.lt, "exact"), "le": (torch.le, "exact"), "gt": (torch.gt, "exact"), "ge": (torch.ge, "exact"),
    "logical_and": (torch.logical_and, "exact"), "logical_or": (torch.logical_or, "exact"),
}
SCALAR_OPS = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "remainder", "eq", "ne", "lt", "le",
              "gt", "ge"]


def pyscalar(s):
    """The Python number an Ember double scalar stands for: an integral value is an int (so
    int_tensor * 2.0 stays integer, as int_tensor * 2 does in Python), others a float."""
    return int(s) if math.isfinite(s) and s == math.trunc(s) else s


def scalar_torch(name):
    f = BINARY_TORCH[name][0]
    if name in ("maximum", "minimum"):  # no scalar form in torch: a 0-dim tensor, which promotes as a scalar does
        return lambda x, s: f(x, torch.tensor(pyscalar(s), dtype=x.dtype if x.is_floating_point() else None))
    return lambda x, s: f(x, pyscalar(s))


OPS = {}
for _n, (_f, _t) in UNARY_TORCH.items():
    OPS[_n] = Op((lambda f: lambda i, a: f(i["x"]))(_f), ("x",), _t)
for _n, (_f, _t) in BINARY_TORCH.items():
    OPS[_n] = Op((lambda f: lambda i, a: f(i["a"], i["b"]))(_f), ("a", "b"), _t)
for _n in SCALAR_OPS:
    OPS[_n + "_scalar"] = Op((lambda f: lambda i, a: f(i["x"], a["s"]))(scalar_torch(_n)), ("x",), BINARY_TORCH[_n][1])
OPS.update({
    "gelu": Op(lambda i, a: F.gelu(i["x"], approximate="tanh" if a["tanh_approx"] else "none"), tol="transc"),
    "leaky_relu": Op(lambda i, a: F.leaky_relu(i["x"], a["slope"]), tol="arith"),
    "softplus": Op(lambda i, a: F.softplus(i["x"], a["beta"], a["threshold"]), tol="transc"),
    "where": Op(lambda i, a: torch.where(i["cond"] != 0, i["a"], i["b"]), ("cond", "a", "b")),
    "cast": Op(lambda i, a: i["x"].to(DTYPES[a["dtype"]])),
    # reductions
    "sum": Op(reduce_fn(torch.sum), tol="reduce"),
    "prod": Op(reduce_fn(prod), tol="reduce"),
    "amax": Op(reduce_fn(torch.amax)),
    "amin": Op(reduce_fn(torch.amin)),
    "mean": Op(reduce_fn(torch.mean), tol="reduce"),
    "argmax": Op(lambda i, a: torch.argmax(i["x"], dim=a["axis"], keepdim=a["keepdim"])),
    "argmin": Op(lambda i, a: torch.argmin(i["x"], dim=a["axis"], keepdim=a["keepdim"])),
    "var": Op(lambda i, a: torch.var(i["x"], dim=axes_or_all(i["x"], a["axes"]), correction=a["correction"],
                                     keepdim=a["keepdim"]), tol="reduce"),
    "std": Op(lambda i, a: torch.std(i["x"], dim=axes_or_all(i["x"], a["axes"]), correction=a["correction"],
                                     keepdim=a["keepdim"]), tol="reduce"),
    "logsumexp": Op(lambda i, a: torch.logsumexp(i["x"], dim=axes_or_all(i["x"], a["axes"]), keepdim=a["keepdim"]),
                    tol="reduce"),
    "softmax": Op(lambda i, a: torch.softmax(i["x"], a["axis"]), tol="reduce"),
    "log_softmax": Op(lambda i, a: torch.log_softmax(i["x"], a["axis"]), tol="reduce"),
    # movement
    "reshape": Op(lambda i, a: i["x"].reshape(a["shape"])),
    "permute": Op(lambda i, a: i["x"].permute(a["perm"])),
    "transpose": Op(lambda i, a: i["x"].transpose(a["d0"], a["d1"])),
    "expand": Op(lambda i, a: i["x"].expand(a["sizes"])),
    "slice": Op(lambda i, a: i["x"][slice_ix(i["x"], a["axis"], a["start"], a["stop"], a["step"])]),
    "squeeze": Op(lambda i, a: squeeze(i["x"], a["axes"])),
    "unsqueeze": Op(lambda i, a: i["x"].unsqueeze(a["axis"])),
    "flip": Op(lambda i, a: torch.flip(i["x"], a["axes"])),
    "slice_scatter": Op(lambda i, a: torch.slice_scatter(i["x"], i["src"], a["axis"], a["start"], a["stop"], a["step"]),
                        ("x", "src")),
    "pad": Op(lambda i, a: F.pad(i["x"], a["pads"], value=a["value"])),
    "cat": Op(lambda i, a: torch.cat(list(i.values()), a["axis"]), "*"),
    "gather": Op(lambda i, a: torch.gather(i["x"], a["axis"], i["index"].long()), ("x", "index")),
    "index_select": Op(lambda i, a: torch.index_select(i["x"], a["axis"], i["index"].long()), ("x", "index")),
    "scatter_add": Op(lambda i, a: torch.scatter_add(i["x"], a["axis"], i["index"].long(), i["src"]),
                      ("x", "index", "src"), "arith"),
    "nonzero": Op(lambda i, a: torch.nonzero(i["x"])),
    # through a contiguous copy: PyTorch 1.13's backward scatters the gradient into a transposed x in
    # memory order, while its forward reads x in row-major order (so the k-th gradient lands on
    # another element than the k-th selected one; a contiguous x gets it right)
    "masked_select": Op(lambda i, a: torch.masked_select(i["x"].contiguous(), i["mask"]), ("x", "mask")),
    # in place, on a clone of x
    "add_": Op(inplace("add_"), ("x", "b"), "arith"),
    "sub_": Op(inplace("sub_"), ("x", "b"), "arith"),
    "mul_": Op(inplace("mul_"), ("x", "b"), "arith"),
    "div_": Op(inplace("div_"), ("x", "b"), "arith"),
    "add_scalar_": Op(inplace("add_"), ("x",), "arith"),
    "mul_scalar_": Op(inplace("mul_"), ("x",), "arith"),
    "zero_": Op(lambda i, a: i["x"].clone().zero_()),
    "fill_": Op(lambda i, a: i["x"].clone().fill_(a["value"])),
    "copy_": Op(lambda i, a: i["x"].clone().copy_(i["src"]), ("x", "src")),
    # extern
    "matmul": Op(lambda i, a: torch.matmul(i["a"], i["b"]), ("a", "b"), "gemm"),
    "conv2d": Op(lambda i, a: F.conv2d(i["x"], i["weight"], i.get("bias"), **conv_params(a)), ("x", "weight", "bias"),
                 "gemm"),
    "conv2d_backward_input": Op(lambda i, a: torch.nn.grad.conv2d_input(
        [i["grad_out"].shape[0], i["weight"].shape[1] * a["groups"]] + a["input_hw"], i["weight"], i["grad_out"],
        **conv_params(a)), ("grad_out", "weight"), "gemm"),
    "conv2d_backward_weight": Op(lambda i, a: torch.nn.grad.conv2d_weight(
        i["x"], [i["grad_out"].shape[1], i["x"].shape[1] // a["groups"]] + a["kernel_hw"], i["grad_out"],
        **conv_params(a)), ("x", "grad_out"), "gemm"),
    # nn composites
    "layer_norm": Op(lambda i, a: F.layer_norm(i["x"], i["x"].shape[-a["n_norm"]:], i.get("weight"), i.get("bias"),
                                               a["eps"]), ("x", "weight", "bias"), "reduce"),
    "rms_norm": Op(lambda i, a: rms_norm(i["x"], a["n_norm"], i.get("weight"), a["eps"]), ("x", "weight"), "reduce"),
    "batch_norm": Op(batch_norm, ("x", "running_mean", "running_var", "weight", "bias"), "reduce"),
    "linear": Op(lambda i, a: F.linear(i["x"], i["weight"], i.get("bias")), ("x", "weight", "bias"), "gemm"),
    "dropout": Op(lambda i, a: F.dropout(i["x"], a["p"], a["training"])),
    "cross_entropy": Op(lambda i, a: F.cross_entropy(i["logits"], long_if_int(i["target"]), weight=i.get("weight"),
                                                     ignore_index=a["ignore_index"], reduction=a["reduction"],
                                                     label_smoothing=a["label_smoothing"]),
                        ("logits", "target", "weight"), "reduce"),
    "nll_loss": Op(lambda i, a: F.nll_loss(i["logp"], long_if_int(i["target"]), weight=i.get("weight"),
                                           ignore_index=a["ignore_index"], reduction=a["reduction"]),
                   ("logp", "target", "weight"), "reduce"),
    "mse_loss": Op(lambda i, a: F.mse_loss(i["x"], i["y"], reduction=a["reduction"]), ("x", "y"), "reduce"),
    "embedding": Op(lambda i, a: F.embedding(i["indices"].long(), i["weight"], padding_idx=a.get("padding_idx")),
                    ("indices", "weight")),
    "max_pool2d": Op(lambda i, a: F.max_pool2d(i["x"], *pool_window(a), dilation=a.get("dilation", 1),
                                               ceil_mode=a.get("ceil_mode", False))),
    "avg_pool2d": Op(lambda i, a: F.avg_pool2d(i["x"], *pool_window(a), ceil_mode=a.get("ceil_mode", False),
                                               count_include_pad=a.get("count_include_pad", True),
                                               divisor_override=a.get("divisor_override")), tol="reduce"),
    "scaled_dot_product_attention": Op(lambda i, a: sdpa(i["q"], i["k"], i["v"], a["causal"], a["scale"]),
                                       ("q", "k", "v"), "gemm"),
    "clamp": Op(lambda i, a: torch.clamp(i["x"], pyscalar(a["lo"]), pyscalar(a["hi"]))),
    "one_hot": Op(lambda i, a: F.one_hot(i["indices"].long(), a["n_classes"]), ("indices",)),
    "masked_fill": Op(lambda i, a: i["x"].masked_fill(i["mask"], a["value"]), ("x", "mask")),
    # creation
    "arange": Op(lambda i, a: torch.arange(a["start"], a["end"], a["step"], dtype=DTYPES[a["dtype"]]), (), "arith"),
    "eye": Op(lambda i, a: torch.eye(a["n"], a["m"], dtype=DTYPES[a["dtype"]]), ()),
    "full": Op(lambda i, a: torch.full(a["shape"], a["value"], dtype=DTYPES[a["dtype"]]), ()),
    # optimizers: the parameter after len(grads) steps
    "sgd": Op(lambda i, a: optimizer_steps(i, a, lambda ps, a: torch.optim.SGD(
        ps, lr=a["lr"], momentum=a["momentum"], dampening=a["dampening"], weight_decay=a["weight_decay"],
        nesterov=a["nesterov"], foreach=False)), ("param", "grads"), "reduce"),
    "adamw": Op(lambda i, a: optimizer_steps(i, a, lambda ps, a: torch.optim.AdamW(
        ps, lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"], weight_decay=a["weight_decay"],
        amsgrad=a["amsgrad"], foreach=False)), ("param", "grads"), "reduce"),
    # torch's keyword options and the LM ops (issue 21)
    "clamp_tensor": Op(lambda i, a: torch.clamp(i["x"], i.get("lo"), i.get("hi")), ("x", "lo", "hi")),
    "add_alpha": Op(lambda i, a: torch.add(i["a"], i["b"], alpha=pyscalar(a["alpha"])), ("a", "b"), "arith"),
    "sub_alpha": Op(lambda i, a: torch.sub(i["a"], i["b"], alpha=pyscalar(a["alpha"])), ("a", "b"), "arith"),
    "div_mode": Op(lambda i, a: torch.div(i["a"], i["b"], rounding_mode=a["rounding_mode"]), ("a", "b"), "arith"),
    "cumsum": Op(lambda i, a: torch.cumsum(i["x"], a["axis"]), tol="reduce"),
    "cumprod": Op(lambda i, a: torch.cumprod(i["x"], a["axis"]), tol="reduce"),
    "sort": Op(lambda i, a: tuple(torch.sort(i["x"], dim=a["axis"], descending=a["descending"], stable=True))),
    "argsort": Op(lambda i, a: torch.argsort(i["x"], dim=a["axis"], descending=a["descending"], stable=True)),
    "topk": Op(lambda i, a: tuple(torch.topk(i["x"], a["k"], dim=a["axis"], largest=a["largest"], sorted=True))),
    "tril": Op(lambda i, a: torch.tril(i["x"], a["diagonal"])),
    "triu": Op(lambda i, a: torch.triu(i["x"], a["diagonal"])),
    "split": Op(lambda i, a: tuple(torch.split(i["x"], a["size"], a["axis"]))),
    "chunk": Op(lambda i, a: tuple(torch.chunk(i["x"], a["chunks"], a["axis"]))),
    # one-hot probability rows make the draws certain, so PyTorch's generator and Ember's agree
    "multinomial": Op(lambda i, a: torch.multinomial(i["probs"], a["num_samples"], a["replacement"]), ("probs",)),
    # random draws, whose values PyTorch's generator and Ember's do not share: their properties
    "multinomial_properties": Op(lambda i, a: multinomial_properties(i["probs"], a["num_samples"], a["replacement"]),
                                 ("probs",)),
    "clip_grad_norm_": Op(lambda i, a: clip_grad_norm(list(i.values()), a["max_norm"], a["norm_type"]), "*", "reduce"),
})


def optimizer_steps(i, a, make):
    """A parameter (a copy of the input) after one optimizer step per row of grads, each step
    with that row as the parameter's gradient."""
    p = i["param"].detach().clone().requires_grad_(True)
    opt = make([p], a)
    for g in i["grads"]:
        opt.zero_grad(set_to_none=True)
        p.grad = g.detach().clone()
        opt.step()
    return p.detach()


def multinomial_properties(probs, num_samples, replacement):
    """What holds for every draw of torch.multinomial: each drawn class has a probability > 0
    (the indices are in range, zero-probability classes never come), and without replacement
    the most often drawn class of a row was drawn once (the draws are distinct)."""
    d = torch.multinomial(probs, num_samples, replacement)
    out = (probs.gather(-1, d) > 0,)
    if not replacement:
        out += (F.one_hot(d, probs.shape[-1]).sum(-2).amax(-1),)
    return out


def clip_grad_norm(grads, max_norm, norm_type):
    """torch.nn.utils.clip_grad_norm_ on parameters whose .grad are the inputs: the total norm and
    the clipped gradients (outputs, so the test can read them back)."""
    ps = []
    for g in grads:
        p = torch.zeros_like(g, requires_grad=True)
        p.grad = g.detach().clone()
        ps.append(p)
    total = torch.nn.utils.clip_grad_norm_(ps, max_norm, norm_type)
    return (total,) + tuple(p.grad for p in ps)


# ---- the cases -------------------------------------------------------------------------------
CASES = []


def case(op, tag, inputs, *, grad=True, tol=None, grad_tol=None, expect_error=None, error_device=None, pending=None,
         **args):
    """One case: op's inputs in the order of its roles (None: an absent optional input).
    expect_error: why Ember refuses it; error_device: only on that device ("cuda")."""
    CASES.append(dict(op=op, tag=tag, inputs=inputs, args=args, grad=grad, tol=tol, grad_tol=grad_tol,
                      expect_error=expect_error, error_device=error_device, pending=pending))


# the unary functions that promote integer and bool inputs to f32
FLOAT_FUNCTIONS = ("exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh", "erf", "reciprocal")


def add_pointwise():
    for name in UNARY_TORCH:
        if name in ("round", "trunc", "frac"):
            continue
        pos = name in ("log", "sqrt", "rsqrt")
        gen = (lambda *s, dt="f32": P(*s, dt=dt)) if pos else R
        grad = name not in ("sign", "floor", "ceil", "logical_not")
        for dt in FLOAT:
            case(name, dt, [gen(3, 4, dt=dt)], grad=grad)
        case(name, "f32_0dim", [gen(dt="f32")], grad=grad)
        case(name, "f32_empty", [gen(0, 3)], grad=grad)
        case(name, "f32_transposed", [gen(3, 4).T()], grad=grad)
        case(name, "f32_stepped", [gen(2, 3).step(1)], grad=grad)
        case(name, "f64_expanded", [gen(3, 4, dt="f64").bcast(0)], grad=grad)
        if name != "clone" and name != "contiguous":
            case(name, "f32_special", [S(8)], grad=grad)
        if name in FLOAT_FUNCTIONS:
            case(name, "i32", [I(3, 4, lo=1, hi=6, dt="i32")])
            case(name, "bool", [B(5)])
        if name in ("neg", "abs", "sign", "floor", "ceil", "logical_not", "clone", "relu"):
            case(name, "i32", [I(3, 4, lo=-5, hi=6, dt="i32")])
            case(name, "i64", [I(3, 4, lo=-5, hi=6, dt="i64")])
        if name in ("logical_not", "clone"):
            case(name, "bool", [B(5)])
    # ties and kinks: the gradient PyTorch takes there
    case("abs", "f32_zero", [V([-1.0, 0.0, -0.0, 2.0])])
    case("relu", "f32_zero", [V([-1.0, 0.0, -0.0, 2.0])])
    case("sqrt", "f32_zero", [V([0.0, 1.0, 4.0])])
    case("log", "f32_zero_negative", [V([0.0, -1.0, 1.0])])
    case("exp", "f32_overflow", [V([88.0, 89.0, -104.0, -110.0, 710.0])])
    case("exp", "f64_overflow", [V([709.0, 710.0, -745.0, -746.0], dt="f64")])
    case("sigmoid", "f32_large", [V([-100.0, -20.0, 0.0, 20.0, 100.0])])
    case("tanh", "f32_large", [V([-30.0, -9.0, 0.0, 9.0, 30.0])])
    case("silu", "f64_large", [V([-800.0, -40.0, 0.0, 40.0, 800.0], dt="f64")])
    case("erf", "f64_tails", [V([-6.0, -3.0, -1e-10, 0.0, 1e-10, 3.0, 6.0], dt="f64")])
    case("log1p", "f32_small", [V([-0.9, -1e-8, 0.0, 1e-8, 1e6])])
    case("expm1", "f32_small", [V([-20.0, -1e-8, 0.0, 1e-8, 20.0])])
    case("reciprocal", "f32_zero", [V([0.0, -0.0, 2.0, -4.0])])
    case("sign", "f32_zero_nan", [V([-3.0, -0.0, 0.0, 2.0, math.nan])], grad=False)
    for name in ("floor", "ceil"):
        case(name, "f32_halves", [V([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.0])], grad=False)
    # PyTorch's gradients of sign, floor, ceil: zero
    for name in ("sign", "floor", "ceil"):
        case(name, "f32_grad", [R(3, 4)])
    for name in ("round", "trunc", "frac"):
        for dt in FLOAT:
            case(name, dt, [R(3, 4, dt=dt)])
        case(name, "f32_halves", [V([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.0, 3.7, -3.7])])
        case(name, "f32_special", [S(8)])
        case(name, "f32_transposed", [R(3, 4).T()])
        if name != "frac":
            case(name, "i64", [I(3, 4, lo=-5, hi=6)])

    case("gelu", "exact_f32", [R(3, 4)], tanh_approx=False)
    case("gelu", "tanh_f32", [R(3, 4)], tanh_approx=True)
    case("gelu", "exact_f64_special", [S(8, dt="f64")], tanh_approx=False)
    case("gelu", "tanh_f64_transposed", [R(3, 4, dt="f64").T()], tanh_approx=True)
    case("gelu", "tanh_f32_large", [V([-20.0, -6.0, 0.0, 6.0, 20.0])], tanh_approx=True)
    case("leaky_relu", "f32", [R(3, 4)], slope=0.1)
    case("leaky_relu", "f64_zero", [V([-1.0, 0.0, 1.0], dt="f64")], slope=0.2)
    case("leaky_relu", "f32_stepped", [R(2, 3).step(0)], slope=0.01)
    case("softplus", "f32", [R(3, 4)], beta=1.0, threshold=20.0)
    case("softplus", "f64_beta", [R(3, 4, dt="f64")], beta=2.0, threshold=3.0)
    case("softplus", "f32_threshold", [V([-30.0, -1.0, 0.0, 9.9, 10.0, 10.1, 30.0])], beta=2.0, threshold=20.0)
    case("softplus", "f32_special", [S(8)], beta=1.0, threshold=20.0)

    # binary
    for name, (f, t) in BINARY_TORCH.items():
        logical = name.startswith("logical") or name in ("eq", "ne", "lt", "le", "gt", "ge")
        ga = (lambda *s, dt="f32": P(*s, dt=dt, lo=0.5, hi=2.0)) if name == "pow" else R
        gb = (lambda *s, dt="f32": P(*s, dt=dt, lo=0.5, hi=2.0)) if name in ("div", "remainder") else R
        for dt in FLOAT:
            case(name, dt, [ga(3, 4, dt=dt), gb(3, 4, dt=dt)])
        case(name, "f32_bcast", [ga(3, 1), gb(1, 4)])
        case(name, "f32_bcast_rank", [ga(2, 3, 4), gb(4)])
        case(name, "f32_0dim", [ga(3), gb()])
        case(name, "f32_both_0dim", [ga(), gb()])
        case(name, "f32_empty", [ga(0, 3), gb(3)])
        case(name, "f32_views", [ga(3, 4).T(), gb(3, 4).step(0)])
        case(name, "f64_expanded", [ga(3, 4, dt="f64").bcast(0), gb(3, 4, dt="f64").bcast(1)])
        if name not in ("pow",):
            case(name, "f32_special", [S(8), R(8)])
            case(name, "f32_special_both", [S(6), S(6)])
        # integers, bool and mixed dtypes
        if name == "pow":
            case(name, "i32", [I(3, 4, lo=-3, hi=4, dt="i32"), I(3, 4, lo=0, hi=4, dt="i32")])
            case(name, "i64", [I(3, 4, lo=-3, hi=4), I(3, 4, lo=0, hi=4)])
            case(name, "i32_f32", [I(3, 4, lo=1, hi=4, dt="i32"), R(3, 4)])
            case(name, "f32_f64", [ga(3, 4), R(3, 4, dt="f64")])
            case(name, "f32_negative_base", [V([-2.0, -2.0, 0.0, 0.0, -0.5]), V([2.0, 0.5, 0.0, 2.0, 3.0])])
            case(name, "i64_negative_exponent", [I(3, lo=1, hi=4), V([1, -1, 2], dt="i64")], grad=False,
                 expect_error="integers to negative integer powers are refused (PyTorch refuses a negative scalar "
                 "exponent, but computes a tensor one: 2 ** -1 is 0)")
            continue
        if name == "remainder":
            case(name, "i32", [I(3, 4, lo=-9, hi=10, dt="i32"), I(3, 4, lo=1, hi=5, dt="i32")])
            case(name, "i64_negative", [I(3, 4, lo=-9, hi=10), I(3, 4, lo=-5, hi=-1)])
            case(name, "f32_signs", [V([5.5, -5.5, 5.5, -5.5, 0.0, -0.0]), V([2.0, 2.0, -2.0, -2.0, 3.0, -3.0])])
            case(name, "f64_i32", [R(3, 4, dt="f64"), I(3, 4, lo=1, hi=4, dt="i32")])
            case(name, "i64_by_zero", [I(3, lo=1, hi=9), V([1, 0, 2], dt="i64")],
                 expect_error="integer remainder by zero is refused, as in torch")
            continue
        if name == "atan2":
            case(name, "i32", [I(3, 4, lo=-3, hi=4, dt="i32"), I(3, 4, lo=-3, hi=4, dt="i32")])
            case(name, "f64_zeros", [V([0.0, -0.0, 0.0, -0.0, 1.0], dt="f64"),
                                     V([0.0, 0.0, -0.0, -0.0, 0.0], dt="f64")], grad=False)
            continue
        if name == "div":
            case(name, "i32", [I(3, 4, lo=-9, hi=10, dt="i32"), I(3, 4, lo=1, hi=5, dt="i32")])
            case(name, "i64_by_zero", [I(4, lo=-2, hi=3), V([0, 0, 0, 0], dt="i64")])
            case(name, "f32_by_zero", [V([1.0, -1.0, 0.0, -0.0]), V([0.0, 0.0, 0.0, -0.0])], grad=False)
        else:
            for dt in ("i32", "i64"):
                case(name, dt, [I(3, 4, lo=-4, hi=5, dt=dt), I(3, 4, lo=-4, hi=5, dt=dt)])
            if name != "sub":
                case(name, "bool", [B(3, 4), B(3, 4)])
        case(name, "i32_i64", [I(3, 4, lo=1, hi=5, dt="i32"), I(4, lo=1, hi=5)])
        case(name, "i32_f32", [I(3, 4, lo=1, hi=5, dt="i32"), gb(3, 4)])
        case(name, "f32_f64", [ga(3, 4), gb(3, 4, dt="f64")])
        case(name, "i64_f64", [I(3, lo=1, hi=5), gb(3, dt="f64")])
        if name != "sub":
            case(name, "bool_f32", [B(3, 4), gb(3, 4)])
            case(name, "bool_i32", [B(3, 4), I(3, 4, lo=1, hi=5, dt="i32")])
        case(name, "i32_0dim_i64", [I(3, lo=1, hi=5, dt="i32"), I(lo=1, hi=5)])
        if logical:
            case(name, "f32_nan_inf", [V([math.nan, math.inf, -math.inf, 1.0, 0.0, -0.0]),
                                       V([math.nan, math.inf, math.inf, math.nan, -0.0, 0.0])])
    case("sub", "bool", [B(3), B(3)], expect_error="subtracting bool tensors is refused, as in torch")
    # integer arithmetic wraps around, as in two's complement
    big32 = V([2147483647, -2147483648, 65536], dt="i32")
    case("add", "i32_wraps", [big32, V([1, -1, 65536], dt="i32")])
    case("mul", "i32_wraps", [big32, V([2, 2, 65536], dt="i32")])
    case("mul", "i64_wraps", [V([9223372036854775807, 4294967296], dt="i64"), V([2, 4294967296], dt="i64")])
    case("sum", "i32_to_i64_no_wrap", [V([2147483647, 2147483647], dt="i32")], axes=[], keepdim=False)
    # maximum / minimum / amax ties split the gradient in PyTorch
    for name in ("maximum", "minimum"):
        case(name, "f32_ties", [V([1.0, 2.0, 3.0, -0.0]), V([1.0, 1.0, 3.0, 0.0])])
        case(name, "f32_nan", [V([math.nan, 1.0, math.nan]), V([1.0, math.nan, math.nan])])
    # a 0-dim tensor takes part in promotion like a scalar: f32[3] + f64[] is f32
    for name in ("add", "mul", "div", "maximum", "lt"):
        case(name, "f32_0dim_f64", [R(3), R(dt="f64")])
        case(name, "i32_0dim_i64_dims", [I(3, lo=1, hi=5, dt="i32"), I(lo=1, hi=5)])
        case(name, "i64_0dim_f64", [I(3, lo=1, hi=5), R(dt="f64")])
        case(name, "f64_0dim_f32_dims", [R(2, 3, dt="f64"), R(dt="f32")])
    for name, alpha in (("add_alpha", 2.5), ("sub_alpha", -0.5)):
        case(name, "f32", [R(3, 4), R(3, 4)], alpha=alpha)
        case(name, "f64_bcast", [R(3, 1, dt="f64"), R(4, dt="f64")], alpha=alpha)
        case(name, "i64", [I(3, 4, lo=-4, hi=5), I(3, 4, lo=-4, hi=5)], alpha=3.0)
    for mode in ("trunc", "floor"):
        case("div_mode", mode + "_f32", [R(3, 4), P(3, 4, lo=0.3)], rounding_mode=mode)
        case("div_mode", mode + "_f64_signs", [V([7.0, -7.0, 7.0, -7.0, 0.5], dt="f64"),
                                               V([2.0, 2.0, -2.0, -2.0, -1.0], dt="f64")],
             rounding_mode=mode)
        case("div_mode", mode + "_i64", [I(3, 4, lo=-9, hi=10), I(3, 4, lo=1, hi=4)], rounding_mode=mode)
        case("div_mode", mode + "_i32_negative", [V([7, -7, 7, -7], dt="i32"), V([2, 2, -2, -2], dt="i32")],
             rounding_mode=mode)
        case("div_mode", mode + "_f32_special", [S(8), V([2.0, -3.0, 0.0, -0.0, math.inf, -math.inf, math.nan, 0.5])],
             rounding_mode=mode)
        case("div_mode", mode + "_f32_zero_divisor", [V([1.0, -1.0, 0.0, math.inf]), V([0.0, -0.0, 0.0, 0.0])],
             rounding_mode=mode)
        case("div_mode", mode + "_f64_inexact", [V([1.0, -1.0, 5.3, -5.3, 1e300, 0.3], dt="f64"),
                                                  V([0.1, 0.1, 0.1, 0.1, 1e-10, -0.1], dt="f64")],
             rounding_mode=mode)
        case("div_mode", mode + "_i64_by_f32", [I(3, 4, lo=-9, hi=10), P(4, lo=0.3)], rounding_mode=mode)
    for name, alpha in (("add_alpha", 0.3), ("sub_alpha", 2.0)):
        case(name, "f32_special_transposed", [S(3, 4), R(3, 4).T()], alpha=alpha)
        case(name, "f32_int_b", [R(3, 4), I(3, 4, lo=-4, hi=5)], alpha=alpha)
    case("add_alpha", "bool", [B(3, 4), B(3, 4)], alpha=1.0)

    # scalar forms
    for name in SCALAR_OPS:
        s = {"pow": 2.0, "div": 0.5, "remainder": 1.5}.get(name, 0.75)
        x = P if name == "pow" else R
        for dt in FLOAT:
            case(name + "_scalar", dt, [x(3, 4, dt=dt)], s=s)
        case(name + "_scalar", "f32_transposed", [x(3, 4).T()], s=s)
        case(name + "_scalar", "f32_0dim", [x()], s=s)
        case(name + "_scalar", "i32", [I(3, 4, lo=1, hi=5, dt="i32")], s=s)
        case(name + "_scalar", "i64_integral", [I(3, 4, lo=-4, hi=5)], s=2.0)
        if name not in ("sub",):
            case(name + "_scalar", "bool", [B(3, 4)], s=s)
        case(name + "_scalar", "f32_special", [S(8)], s=s)
    case("pow_scalar", "f32_half", [P(3, 4)], s=0.5)
    case("pow_scalar", "f32_negative_exp", [S(8)], s=-1.0)
    case("pow_scalar", "f64_zero_exp", [S(6, dt="f64")], s=0.0)
    case("pow_scalar", "f32_cube_negative", [R(3, 4)], s=3.0)
    case("mul_scalar", "f32_inf", [R(3, 4)], s=math.inf)
    case("div_scalar", "f32_by_zero", [S(6)], s=0.0)
    case("eq_scalar", "f32_nan", [S(6)], s=math.nan)
    case("maximum_scalar", "f32_nan_scalar", [R(4)], s=math.nan)

    # where, cast
    case("where", "f32", [B(3, 4), R(3, 4), R(3, 4)])
    case("where", "f64_bcast", [B(3, 1), R(1, 4, dt="f64"), R(dt="f64")])
    case("where", "f32_cond_float", [V([0.0, 1.0, -0.0, math.nan, 2.0]), R(5), R(5)])
    case("where", "i32_f32", [B(4), I(4, lo=0, hi=5, dt="i32"), R(4)])
    case("where", "i64_views", [B(3, 4).bcast(0), I(3, 4, lo=0, hi=5).T(), I(3, 4, lo=0, hi=5).step(1)])
    case("where", "f32_special", [B(6), S(6), S(6)])
    case("where", "f32_empty", [B(0, 3), R(0, 3), R(3)])
    for src, dst in (("f32", "f64"), ("f64", "f32"), ("f32", "i32"), ("f64", "i64"), ("f32", "bool"),
                     ("i32", "f32"), ("i64", "i32"), ("bool", "f32"), ("i32", "bool"), ("bool", "i64")):
        if src in FLOAT:
            x = R(3, 4, dt=src)
            x.gen, x.lo, x.hi = "uniform", -5.0, 5.0
        elif src == "bool":
            x = B(3, 4)
        else:
            x = I(3, 4, lo=-3, hi=4, dt=src)
        case("cast", src + "_to_" + dst, [x], dtype=dst)
    case("cast", "f32_to_f64_transposed", [R(3, 4).T()], dtype="f64")
    case("cast", "f32_special_to_bool", [S(6)], dtype="bool")
    case("cast", "f64_special_to_f32", [S(6, dt="f64")], dtype="f32")
    case("cast", "f64_to_f32_overflow", [V([1e39, -1e39, 1e-46, 3.4028235e38], dt="f64")], dtype="f32")
    case("cast", "f32_to_i32_truncates", [V([-2.7, -0.5, 0.5, 2.7, 1e9])], dtype="i32")

    # clamp and its kinks
    case("clamp", "f32", [R(3, 4)], lo=-0.5, hi=0.5)
    case("clamp", "f64_lo_only", [R(3, 4, dt="f64")], lo=0.0, hi=math.inf)
    case("clamp", "f32_hi_only", [R(3, 4).T()], lo=-math.inf, hi=0.25)
    case("clamp", "f32_at_bounds", [V([-1.0, -0.5, 0.0, 0.5, 1.0])], lo=-0.5, hi=0.5)
    case("clamp", "f32_special", [S(8)], lo=-1.0, hi=1.0)
    case("clamp", "f32_lo_above_hi", [R(6)], lo=1.0, hi=-1.0)
    case("clamp", "i32", [I(3, 4, lo=-5, hi=6, dt="i32")], lo=-2.0, hi=3.0)
    case("clamp", "f32_nan_bound", [R(4)], lo=math.nan, hi=1.0)
    case("clamp_tensor", "f32", [R(3, 4), R(3, 1), P(4)])
    case("clamp_tensor", "f64_lo_only", [R(3, 4, dt="f64"), R(4, dt="f64"), None])
    case("clamp_tensor", "f32_hi_only_0dim", [R(3, 4).T(), None, R()])
    case("clamp_tensor", "f32_at_bounds", [V([-1.0, -0.5, 0.0, 0.5, 1.0]), V([-0.5] * 5), V([0.5] * 5)])
    case("clamp_tensor", "i64", [I(3, 4, lo=-5, hi=6), I(4, lo=-3, hi=0), I(3, 1, lo=0, hi=3)])


def add_reductions():
    for name in ("sum", "prod", "amax", "amin", "mean"):
        for dt in FLOAT:
            case(name, dt + "_all", [R(3, 4, dt=dt)], axes=[], keepdim=False)
        case(name, "f32_axis0", [R(3, 4)], axes=[0], keepdim=False)
        case(name, "f32_axis_neg_keep", [R(2, 3, 4)], axes=[-1], keepdim=True)
        case(name, "f32_axes02", [R(2, 3, 4)], axes=[0, 2], keepdim=False)
        case(name, "f64_axes12_keep", [R(2, 3, 4, dt="f64")], axes=[1, 2], keepdim=True)
        case(name, "f32_all_keep", [R(2, 3)], axes=[], keepdim=True)
        case(name, "f32_0dim", [R()], axes=[], keepdim=False)
        case(name, "f32_transposed", [R(3, 4).T()], axes=[1], keepdim=False)
        case(name, "f32_stepped", [R(3, 4).step(1)], axes=[0], keepdim=True)
        case(name, "f32_expanded", [R(3, 4).bcast(0)], axes=[0], keepdim=False)
        case(name, "f32_special", [S(2, 4)], axes=[1], keepdim=False)
        if name in ("sum", "prod", "mean"):
            case(name, "f32_empty_axis", [R(0, 3)], axes=[0], keepdim=False)
            case(name, "f32_empty_all", [R(2, 0)], axes=[], keepdim=False)
            case(name, "f32_empty_other", [R(0, 3)], axes=[1], keepdim=True)
        else:
            case(name, "f32_empty_other", [R(0, 3)], axes=[1], keepdim=False)
            case(name, "f32_empty_axis", [R(0, 3)], axes=[0], keepdim=False, expect_error=
                 "reducing a size-0 dim has no identity for amax/amin: refused, as in torch")
        if name != "mean":
            case(name, "i32", [I(3, 4, lo=-3, hi=4, dt="i32")], axes=[1], keepdim=False)
            case(name, "i64_all", [I(3, 4, lo=-3, hi=4)], axes=[], keepdim=False)
            if name in ("sum", "prod"):
                case(name, "bool", [B(3, 4)], axes=[0], keepdim=False)
    case("amax", "f32_ties", [V([1.0, 3.0, 3.0, 2.0, 3.0, 0.0], [2, 3])], axes=[], keepdim=False)
    case("amin", "f32_ties_axis", [V([1.0, 1.0, 3.0, 2.0, 5.0, 2.0], [2, 3])], axes=[1], keepdim=False)
    case("amax", "f32_inf", [V([-math.inf, -math.inf, 1.0, math.inf], [2, 2])], axes=[1], keepdim=False)
    case("prod", "f32_zeros", [V([1.0, 0.0, 3.0, 0.0, 0.0, 2.0, 4.0, 5.0, 6.0], [3, 3])], axes=[1], keepdim=False)
    case("prod", "f64_zero_all", [V([2.0, 0.0, 3.0, -1.0], dt="f64")], axes=[], keepdim=False)
    for name in ("argmax", "argmin"):
        case(name, "f32_axis1", [R(3, 4)], axis=1, keepdim=False)
        case(name, "f64_axis0_keep", [R(3, 4, dt="f64")], axis=0, keepdim=True)
        case(name, "f32_all", [R(3, 4)], axis=None, keepdim=False)
        case(name, "f32_all_keep", [R(3, 4)], axis=None, keepdim=True)
        case(name, "f32_ties", [V([1.0, 5.0, 5.0, 0.0, 0.0, 5.0], [2, 3])], axis=1, keepdim=False)
        case(name, "f32_nan", [V([1.0, math.nan, 5.0, -1.0, 2.0, math.nan], [2, 3])], axis=1, keepdim=False)
        case(name, "i32_neg_axis", [I(2, 3, 4, lo=-9, hi=9, dt="i32")], axis=-1, keepdim=False)
        case(name, "f32_transposed", [R(3, 4).T()], axis=0, keepdim=False)
        case(name, "f32_0dim", [R()], axis=None, keepdim=False)
    for name in ("var", "std"):
        for corr in (0, 1, 2):
            case(name, "f32_axis1_c%d" % corr, [R(3, 5)], axes=[1], correction=corr, keepdim=False)
        case(name, "f64_all", [R(3, 4, dt="f64")], axes=[], correction=1, keepdim=False)
        case(name, "f32_axes02_keep", [R(2, 3, 4)], axes=[0, 2], correction=1, keepdim=True)
        case(name, "f32_transposed", [R(3, 4).T()], axes=[0], correction=1, keepdim=False)
        case(name, "f32_one_element", [R(1, 3)], axes=[0], correction=1, keepdim=False)
        case(name, "f32_special", [S(2, 4)], axes=[1], correction=1, keepdim=False)
        case(name, "f32_constant", [V([2.0, 2.0, 2.0, 2.0])], axes=[], correction=1, keepdim=False)
    case("mean", "f64_expanded_all", [R(3, 4, dt="f64").bcast(1)], axes=[], keepdim=False)
    for name in ("logsumexp",):
        case(name, "f32_axis1", [R(3, 4)], axes=[1], keepdim=False)
        case(name, "f64_all_keep", [R(3, 4, dt="f64")], axes=[], keepdim=True)
        case(name, "f32_axes02", [R(2, 3, 4)], axes=[0, 2], keepdim=False)
        # PyTorch's f32 gradient exp(x - lse) is 3e-5 off here (lse = 1000.69 rounds to f32's 6e-5
        # spacing); the exact one (f64) is 0.97123706, which Ember gives: a looser tolerance
        case(name, "f32_large", [V([1000.0, 1000.0, -1000.0, 0.0], [2, 2])], axes=[1], keepdim=False, grad_tol="gemm")
        case(name, "f32_inf", [V([-math.inf, -math.inf, math.inf, 1.0, -math.inf, 0.0], [3, 2])], axes=[1],
             keepdim=False)
        case(name, "f32_nan", [V([math.nan, 1.0, 2.0, 3.0], [2, 2])], axes=[1], keepdim=False)
        case(name, "f32_transposed", [R(3, 4).T()], axes=[-1], keepdim=True)
        case(name, "f32_empty_other", [R(0, 3)], axes=[1], keepdim=False)
        case(name, "f32_empty_axis", [R(0, 3)], axes=[0], keepdim=False)
    for name in ("softmax", "log_softmax"):
        case(name, "f32_last", [R(3, 5)], axis=-1)
        case(name, "f64_axis0", [R(3, 5, dt="f64")], axis=0)
        case(name, "f32_3d_mid", [R(2, 3, 4)], axis=1)
        case(name, "f32_transposed", [R(3, 4).T()], axis=1)
        case(name, "f32_expanded", [R(3, 4).bcast(0)], axis=1)
        case(name, "f32_masked", [V([0.0, -math.inf, 1.0, -math.inf, -math.inf, 2.0], [2, 3])], axis=1)
        case(name, "f32_all_masked", [V([-math.inf, -math.inf, 1.0, 2.0], [2, 2])], axis=1)
        case(name, "f32_large", [V([1000.0, 0.0, -1000.0, 88.0], [2, 2])], axis=1)
        case(name, "f32_nan", [V([math.nan, 1.0, 2.0, 3.0], [2, 2])], axis=1)
        case(name, "f32_0dim", [R()], axis=0, expect_error="axis 0 of a 0-dim tensor is refused (PyTorch takes "
             "dims 0 and -1 of a 0-dim tensor as the tensor itself)")
        case(name, "f32_empty", [R(0, 3)], axis=1)


def add_movement():
    case("reshape", "f32_merge", [R(2, 3, 4)], shape=[6, 4])
    case("reshape", "f32_infer", [R(2, 3, 4)], shape=[-1, 3])
    case("reshape", "f64_transposed_copy", [R(3, 4, dt="f64").T()], shape=[12])
    case("reshape", "f32_stepped", [R(2, 3).step(1)], shape=[3, 2])
    case("reshape", "i64_0dim", [I()], shape=[1, 1])
    case("reshape", "f32_to_0dim", [R(1, 1)], shape=[])
    case("reshape", "f32_empty", [R(0, 4)], shape=[2, 0, 4])
    case("reshape", "bool_expanded", [B(3, 4).bcast(0)], shape=[2, 6])
    case("permute", "f32", [R(2, 3, 4)], perm=[2, 0, 1])
    case("permute", "f64_negative", [R(2, 3, 4, dt="f64")], perm=[-1, -3, -2])
    case("permute", "f32_transposed", [R(3, 4).T()], perm=[1, 0])
    case("transpose", "f32", [R(2, 3, 4)], d0=0, d1=2)
    case("transpose", "i32_negative", [I(2, 3, dt="i32")], d0=-1, d1=0)
    case("expand", "f32", [R(3, 1)], sizes=[2, 3, 4])
    case("expand", "f64_keep", [R(1, 4, dt="f64")], sizes=[3, -1])
    case("expand", "f32_0dim", [R()], sizes=[2, 2])
    case("expand", "f32_stepped", [R(3, 1).step(0)], sizes=[3, 5])
    case("expand", "f32_to_empty", [R(1, 3)], sizes=[0, 3])
    for tag, args in (("step2", (1, 0, 4, 2)), ("negative_start", (0, -2, 100, 1)), ("clamped", (1, 2, 99, 3)),
                      ("empty", (1, 3, 1, 1)), ("full", (0, -100, 100, 1))):
        case("slice", "f32_" + tag, [R(3, 4)], axis=args[0], start=args[1], stop=args[2], step=args[3])
    case("slice", "f64_transposed", [R(3, 5, dt="f64").T()], axis=0, start=1, stop=5, step=2)
    case("slice", "f32_stepped_again", [R(3, 4).step(1)], axis=-1, start=0, stop=4, step=3)
    case("slice", "i64_expanded", [I(3, 4).bcast(0)], axis=0, start=0, stop=2, step=1)
    case("squeeze", "f32_all", [R(1, 3, 1, 2)], axes=[])
    case("squeeze", "f32_one", [R(1, 3, 1, 2)], axes=[-2])
    case("squeeze", "f64_two", [R(1, 3, 1, dt="f64")], axes=[0, 2])
    case("squeeze", "f32_0dim", [R()], axes=[])
    case("squeeze", "f32_not_one", [R(2, 3)], axes=[0])
    case("squeeze", "f32_mixed", [R(1, 3)], axes=[0, 1])
    case("unsqueeze", "f32_front", [R(3, 4)], axis=0)
    case("unsqueeze", "f32_back_negative", [R(3, 4)], axis=-1)
    case("unsqueeze", "f64_0dim", [R(dt="f64")], axis=0)
    case("unsqueeze", "i32_transposed", [I(3, 4, dt="i32").T()], axis=1)
    case("flip", "f32_one", [R(3, 4)], axes=[1])
    case("flip", "f64_two_negative", [R(2, 3, 4, dt="f64")], axes=[0, -1])
    case("flip", "f32_transposed", [R(3, 4).T()], axes=[0])
    case("flip", "bool_stepped", [B(3, 4).step(1)], axes=[1])
    case("flip", "f32_empty", [R(0, 3)], axes=[0])
    case("flip", "f32_0dim", [R()], axes=[])
    case("slice_scatter", "f32_step", [R(3, 5), R(3, 2)], axis=1, start=1, stop=5, step=2)
    case("slice_scatter", "f64_axis0", [R(4, 3, dt="f64"), R(2, 3, dt="f64")], axis=0, start=-2, stop=100, step=1)
    case("slice_scatter", "f32_views", [R(3, 5).T(), R(3, 2).bcast(0)], axis=1, start=0, stop=4, step=3)
    case("pad", "f32_last", [R(2, 3)], pads=[1, 2], value=0.0)
    case("pad", "f64_two_dims", [R(2, 3, dt="f64")], pads=[1, 0, 0, 2], value=-1.5)
    case("pad", "f32_three_dims", [R(1, 2, 2)], pads=[1, 1, 1, 1, 1, 0], value=0.0)
    case("pad", "f32_transposed_nan", [R(3, 4).T()], pads=[0, 1, 2, 0], value=math.nan)
    case("pad", "i64", [I(2, 3)], pads=[2, 1], value=7.0)
    case("pad", "f32_empty", [R(0, 2)], pads=[1, 1, 1, 1], value=3.0)
    case("pad", "f32_zero_amounts", [R(2, 2)], pads=[0, 0], value=3.0)
    case("pad", "f32_negative", [R(3, 5)], pads=[-1, 2, 0, -1], value=0.0)
    case("pad", "f64_negative_all", [R(4, 4, dt="f64")], pads=[-1, -1, -2, -1], value=0.0)
    case("cat", "f32_axis0", [R(2, 3), R(1, 3), R(3, 3)], axis=0)
    case("cat", "f64_axis_negative", [R(2, 3, dt="f64"), R(2, 1, dt="f64")], axis=-1)
    case("cat", "f32_views", [R(3, 4).T(), R(2, 4).step(1), R(2, 4).bcast(0)], axis=0)
    case("cat", "f32_empty", [R(0, 3), R(2, 3), R(0, 3)], axis=0)
    case("cat", "mixed_dtypes", [I(2, dt="i32"), R(3), B(1)], axis=0)
    case("cat", "i64_one", [I(2, 2)], axis=1)
    # indexing
    case("gather", "f32_axis0", [R(3, 4), I(2, 4, lo=0, hi=3)], axis=0)
    case("gather", "f64_axis1_small_index", [R(3, 4, dt="f64"), I(2, 2, lo=0, hi=4)], axis=1)
    case("gather", "f32_repeated", [R(4), V([0, 0, 3, 3, 1], dt="i64")], axis=0)
    case("gather", "f32_views_i32", [R(3, 4).T(), I(2, 3, lo=0, hi=3, dt="i32")], axis=-1)
    case("gather", "f32_out_of_range", [R(3), V([0, 3], dt="i64")], axis=0,
         expect_error="an index out of range is refused, as in torch")
    case("index_select", "f32_axis0", [R(3, 4), V([2, 0, 2], dt="i64")], axis=0)
    case("index_select", "f64_axis1_i32", [R(3, 4, dt="f64"), V([3, 1], dt="i32")], axis=1)
    case("index_select", "f32_transposed", [R(3, 4).T(), V([1, 1, 0], dt="i64")], axis=0)
    case("index_select", "i64_empty_index", [I(3, 4), V([], dt="i64")], axis=0)
    case("index_select", "f32_negative_index", [R(3), V([-1], dt="i64")], axis=0,
         expect_error="a negative index is refused, as in torch")
    case("scatter_add", "f32_axis0", [R(3, 4), I(2, 4, lo=0, hi=3), R(2, 4)], axis=0)
    case("scatter_add", "f64_axis1_repeated", [R(2, 4, dt="f64"), V([0, 0, 3, 0, 1, 1], [2, 3], dt="i64"),
                                                R(2, 3, dt="f64")], axis=1)
    case("scatter_add", "f32_views", [R(3, 4).T(), I(2, 3, lo=0, hi=3), R(2, 3).bcast(0)], axis=0)
    case("scatter_add", "i64", [I(5), V([0, 4, 0], dt="i64"), I(3)], axis=0)
    case("nonzero", "f32", [V([0.0, 1.5, 0.0, -2.0, math.nan, -0.0], [2, 3])])
    case("nonzero", "i64_3d", [I(2, 2, 3, lo=0, hi=2)])
    case("nonzero", "bool_transposed", [B(3, 4).T()])
    case("nonzero", "f32_0dim", [V([2.0], [])])
    case("nonzero", "f32_none", [V([0.0, 0.0])])
    case("masked_select", "f32", [R(3, 4), B(3, 4)])
    case("masked_select", "f64_bcast_mask", [R(3, 4, dt="f64"), B(4)])
    case("masked_select", "f32_transposed", [R(3, 4).T(), B(3, 4)])
    case("masked_select", "i32_none", [I(4, dt="i32"), V([0, 0, 0, 0], dt="bool")])
    # in place, on a clone of x; Ember's autograd records out-of-place ops only
    no_inplace_grad = "in-place ops on tensors that require grad are refused (autograd records out-of-place ops only)"
    for name in ("add_", "sub_", "mul_", "div_"):
        case(name, "f32", [R(3, 4), P(3, 4)], grad=False)
        case(name, "f64_bcast", [R(3, 4, dt="f64"), P(4, dt="f64")], grad=False)
        case(name, "f32_views", [R(3, 4).T(), P(3, 4).step(0)], grad=False)
        case(name, "f32_from_i64", [R(3, 4), I(4, lo=1, hi=4)], grad=False)
        case(name, "f32_grad", [R(3, 4), P(3, 4)], expect_error=no_inplace_grad)
    case("add_", "i64_from_f32", [I(3), R(3)], expect_error="an integer tensor cannot hold a float result, as in torch")
    case("add_scalar_", "f32", [R(3, 4)], s=1.5, grad=False)
    case("mul_scalar_", "f64_transposed", [R(3, 4, dt="f64").T()], s=-2.0, grad=False)
    case("mul_scalar_", "f32_grad", [R(3, 4)], s=-2.0, expect_error=no_inplace_grad)
    case("zero_", "f32", [R(3, 4)], grad=False)
    case("fill_", "f64", [R(3, 4, dt="f64")], value=2.5, grad=False)
    case("fill_", "i32", [I(3, dt="i32")], value=3.0)
    case("copy_", "f32_bcast", [R(3, 4), R(4)], grad=False)
    case("copy_", "f32_from_f64_transposed", [R(3, 4), R(3, 4, dt="f64").T()], grad=False)
    case("copy_", "i32_from_f32", [I(3, dt="i32"), V([1.7, -1.7, 2.0])], grad=False)
    case("copy_", "f32_grad", [R(3, 4), R(4)], expect_error=no_inplace_grad)
    # creation
    case("arange", "f32", [], dtype="f32", start=0.0, end=5.0, step=1.0)
    case("arange", "f64_fraction", [], dtype="f64", start=-1.0, end=1.0, step=0.3)
    case("arange", "i64_negative_step", [], dtype="i64", start=10.0, end=0.0, step=-3.0)
    case("arange", "f32_empty", [], dtype="f32", start=2.0, end=2.0, step=1.0)
    case("eye", "f32_square", [], dtype="f32", n=3, m=3)
    case("eye", "i64_wide", [], dtype="i64", n=2, m=4)
    case("full", "f64", [], dtype="f64", shape=[2, 3], value=-1.25)
    case("full", "bool", [], dtype="bool", shape=[3], value=1.0)
    case("full", "f32_0dim_nan", [], dtype="f32", shape=[], value=math.nan)

    # cumsum, cumprod, sort, topk, tril, triu, split, chunk
    for name in ("cumsum", "cumprod"):
        case(name, "f32_axis1", [R(3, 4)], axis=1)
        case(name, "f64_axis0", [R(3, 4, dt="f64")], axis=0)
        case(name, "f32_transposed_negative", [R(3, 4).T()], axis=-1)
        case(name, "i32", [I(3, 4, lo=-3, hi=4, dt="i32")], axis=1)
        case(name, "f32_special", [S(8)], axis=0)
        case(name, "f32_empty", [R(0, 3)], axis=0)
        case(name, "f32_0dim", [R()], axis=0)
    case("cumprod", "f32_zeros", [V([2.0, 0.0, 3.0, 0.0, 4.0])], axis=0)
    case("cumsum", "bool", [V([True, False, True, True], dt="bool")], axis=0)
    case("cumprod", "i64_wide", [V([1 << 20, 1 << 20, 1 << 20, 3], dt="i64")], axis=0)
    for name in ("sort",):
        case(name, "f32_ascending", [R(3, 5)], axis=1, descending=False)
        case(name, "f64_descending_axis0", [R(4, 3, dt="f64")], axis=0, descending=True)
        case(name, "f32_ties_stable", [V([2.0, 1.0, 2.0, 1.0, 0.0, 2.0])], axis=0, descending=False)
        case(name, "f32_nan", [V([2.0, math.nan, -1.0, math.inf, -math.inf])], axis=0, descending=False)
        case(name, "i64_transposed", [I(3, 4, lo=-5, hi=5).T()], axis=-1, descending=True)
    case("sort", "f32_nan_signed_zeros_descending", [V([0.0, math.nan, -0.0, 1.0, math.nan, -1.0, 0.0])], axis=0,
         descending=True)
    case("sort", "bool", [V([True, False, True, False, False], dt="bool")], axis=0, descending=True)
    case("argsort", "f32", [R(3, 5)], axis=1, descending=False)
    case("argsort", "f32_nan_ties_descending", [V([2.0, math.nan, 1.0, 2.0, -0.0, 0.0])], axis=0, descending=True)
    case("argsort", "f32_nan_ties_ascending", [V([2.0, math.nan, 1.0, 2.0, -0.0, 0.0])], axis=0, descending=False)
    case("argsort", "i32_transposed_axis0", [I(3, 4, lo=-2, hi=2, dt="i32").T()], axis=0, descending=False)
    case("argsort", "bool", [V([True, False, True, False], dt="bool")], axis=0, descending=False)
    case("topk", "f32_largest", [R(3, 6)], k=2, axis=1, largest=True)
    case("topk", "f64_smallest_axis0", [R(5, 3, dt="f64")], k=3, axis=0, largest=False)
    case("topk", "f32_transposed", [R(3, 4).T()], k=1, axis=-1, largest=True)
    case("topk", "i32_k0", [I(3, 4, dt="i32")], k=0, axis=1, largest=True)
    # no ties: torch.topk's order among equal elements is unspecified (its CPU kernel does not keep
    # them in index order), Ember's keeps the first first
    case("topk", "f32_nan_largest", [V([2.0, math.nan, -1.0, math.inf, -math.inf])], k=2, axis=0, largest=True)
    case("topk", "f32_nan_smallest", [V([2.0, math.nan, -1.0, math.inf, -math.inf])], k=3, axis=0, largest=False)
    case("topk", "f64_k_all", [R(2, 4, dt="f64")], k=4, axis=1, largest=False)
    for name in ("tril", "triu"):
        case(name, "f32", [R(3, 4)], diagonal=0)
        case(name, "f64_batched_positive", [R(2, 3, 3, dt="f64")], diagonal=1)
        case(name, "f32_transposed_negative", [R(4, 3).T()], diagonal=-1)
        case(name, "i64", [I(3, 3)], diagonal=0)
    case("tril", "bool_wide", [B(3, 5)], diagonal=2)
    case("triu", "f32_diagonal_past_the_end", [R(3, 4)], diagonal=-5)
    case("split", "f32_even", [R(6, 2)], size=2, axis=0)
    case("split", "f32_size_past_the_end", [R(3, 2)], size=5, axis=0)
    case("split", "f32_empty", [R(0, 3)], size=2, axis=0)
    case("chunk", "f32_empty", [R(0, 3)], chunks=2, axis=0)
    case("split", "f64_uneven_negative", [R(2, 5, dt="f64")], size=2, axis=-1)
    case("split", "f32_transposed", [R(3, 4).T()], size=3, axis=0)
    case("chunk", "f32_even", [R(6, 2)], chunks=3, axis=0)
    case("chunk", "f64_uneven", [R(2, 5, dt="f64")], chunks=2, axis=1)
    case("chunk", "f32_more_chunks_than_size", [R(2, 3)], chunks=5, axis=1)


def add_extern():
    case("matmul", "f32_2d", [R(3, 4), R(4, 5)])
    case("matmul", "f64_2d", [R(3, 4, dt="f64"), R(4, 2, dt="f64")])
    case("matmul", "f32_batched", [R(2, 3, 4), R(2, 4, 2)])
    case("matmul", "f32_batch_bcast", [R(2, 1, 3, 4), R(3, 4, 2)])
    case("matmul", "f32_3d_by_2d", [R(2, 3, 4), R(4, 5)])
    case("matmul", "f32_1d_1d", [R(4), R(4)])
    case("matmul", "f32_1d_2d", [R(4), R(4, 3)])
    case("matmul", "f32_2d_1d", [R(3, 4), R(4)])
    case("matmul", "f64_batched_1d", [R(2, 3, 4, dt="f64"), R(4, dt="f64")])
    case("matmul", "f32_transposed", [R(3, 4).T(), R(4, 5).T()])
    case("matmul", "f32_stepped_expanded", [R(3, 4).step(0), R(2, 4, 2).bcast(0)])
    case("matmul", "f32_k0", [R(3, 0), R(0, 2)])
    no_int_gemm = "integer matmul has no CUDA kernel (cuBLAS has no integer GEMM)"
    case("matmul", "i64", [I(2, 3, lo=-3, hi=4), I(3, 2, lo=-3, hi=4)], expect_error=no_int_gemm, error_device="cuda")
    case("matmul", "i32_batched", [I(2, 2, 3, lo=-3, hi=4, dt="i32"), I(3, 2, lo=-3, hi=4, dt="i32")],
         expect_error=no_int_gemm, error_device="cuda")
    case("matmul", "f32_special", [S(2, 3), R(3, 2)])
    case("matmul", "f32_0dim", [R(), R(3)], expect_error="matmul of a 0-dim tensor is refused, as in torch")
    case("matmul", "f32_f64", [R(2, 3), R(3, 2, dt="f64")], expect_error="matmul needs one dtype, as in torch")
    D = dict(stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1)
    case("conv2d", "f32", [R(2, 3, 5, 5), R(4, 3, 3, 3), R(4)], **D)
    case("conv2d", "f64_no_bias", [R(1, 2, 4, 5, dt="f64"), R(3, 2, 2, 3, dt="f64"), None], **D)
    case("conv2d", "f32_stride_pad", [R(1, 2, 6, 5), R(2, 2, 3, 3), R(2)], stride=[2, 1], padding=[1, 2],
         dilation=[1, 1], groups=1)
    case("conv2d", "f32_dilation", [R(1, 1, 7, 7), R(2, 1, 3, 3), None], stride=[1, 1], padding=[0, 0],
         dilation=[2, 3], groups=1)
    case("conv2d", "f32_groups", [R(2, 4, 4, 4), R(6, 2, 3, 3), R(6)], stride=[1, 1], padding=[1, 1],
         dilation=[1, 1], groups=2)
    case("conv2d", "f64_depthwise", [R(1, 3, 4, 4, dt="f64"), R(3, 1, 2, 2, dt="f64"), R(3, dt="f64")],
         stride=[2, 2], padding=[0, 0], dilation=[1, 1], groups=3)
    case("conv2d", "f32_views", [R(1, 2, 4, 5).T(), R(3, 2, 2, 2).step(0), R(3).bcast(0)], **D)
    case("conv2d", "f32_1x1", [R(2, 3, 2, 2), R(2, 3, 1, 1), None], **D)
    case("conv2d", "f32_special", [S(1, 1, 3, 3), R(1, 1, 2, 2), None], **D)
    case("conv2d_backward_input", "f32", [R(2, 4, 3, 3), R(4, 3, 3, 3)], input_hw=[5, 5], **D)
    case("conv2d_backward_input", "f64_stride_pad", [R(1, 2, 3, 7, dt="f64"), R(2, 2, 3, 3, dt="f64")],
         input_hw=[6, 5], stride=[2, 1], padding=[1, 2], dilation=[1, 1], groups=1)
    case("conv2d_backward_weight", "f32", [R(2, 3, 5, 5), R(2, 4, 3, 3)], kernel_hw=[3, 3], **D)
    case("conv2d_backward_weight", "f64_groups", [R(1, 4, 4, 4, dt="f64"), R(1, 6, 4, 4, dt="f64")],
         kernel_hw=[3, 3], stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=2)


def add_nn():
    case("layer_norm", "f32_affine", [R(3, 5), R(5), R(5)], n_norm=1, eps=1e-5)
    case("layer_norm", "f64_two_dims", [R(2, 3, 4, dt="f64"), R(3, 4, dt="f64"), R(3, 4, dt="f64")], n_norm=2,
         eps=1e-5)
    case("layer_norm", "f32_plain", [R(4, 6), None, None], n_norm=1, eps=1e-3)
    case("layer_norm", "f32_weight_only", [R(2, 4), R(4), None], n_norm=1, eps=1e-5)
    case("layer_norm", "f32_transposed", [R(4, 3).T(), R(3), R(3)], n_norm=1, eps=1e-5)
    case("layer_norm", "f32_constant_rows", [V([1.0, 1.0, 1.0, 2.0, 2.0, 2.0], [2, 3]), R(3), R(3)], n_norm=1, eps=1e-5)
    case("layer_norm", "f32_special", [S(2, 4), None, None], n_norm=1, eps=1e-5)
    case("rms_norm", "f32", [R(3, 5), R(5)], n_norm=1, eps=1e-6)
    case("rms_norm", "f64_two_dims", [R(2, 3, 4, dt="f64"), R(3, 4, dt="f64")], n_norm=2, eps=1e-6)
    case("rms_norm", "f32_no_weight_stepped", [R(3, 4).step(1), None], n_norm=1, eps=1e-5)
    case("rms_norm", "f32_zero_row", [V([0.0, 0.0, 1.0, 2.0], [2, 2]), None], n_norm=1, eps=1e-6)
    for training in (True, False):
        tag = "train" if training else "eval"
        stats = lambda c: [R(c).nograd(), P(c, lo=0.5, hi=1.5).nograd()]
        case("batch_norm", tag + "_f32", [R(4, 3, 2, 2)] + stats(3) + [R(3), R(3)], training=training,
             momentum=0.1, eps=1e-5)
        case("batch_norm", tag + "_f64_2d", [R(5, 3, dt="f64"), R(3, dt="f64").nograd(),
                                             P(3, dt="f64", lo=0.5, hi=1.5).nograd(), R(3, dt="f64"), R(3, dt="f64")],
             training=training, momentum=0.3, eps=1e-3)
        case("batch_norm", tag + "_f32_no_affine", [R(3, 2, 4)] + stats(2) + [None, None], training=training,
             momentum=0.1, eps=1e-5)
        case("batch_norm", tag + "_f32_transposed", [R(3, 4).T()] + stats(4) + [R(4), R(4)], training=training,
             momentum=0.1, eps=1e-5)
    case("batch_norm", "train_f32_no_stats", [R(4, 3), None, None, R(3), R(3)], training=True, momentum=0.1,
         eps=1e-5)
    case("linear", "f32", [R(3, 4), R(5, 4), R(5)])
    case("linear", "f64_no_bias_batched", [R(2, 3, 4, dt="f64"), R(2, 4, dt="f64"), None])
    case("linear", "f32_1d", [R(4), R(3, 4), R(3)])
    case("linear", "f32_views", [R(4, 3).T(), R(5, 3).T(), R(5).bcast(0)])
    case("dropout", "f32_train_p0", [R(3, 4)], p=0.0, training=True)
    case("dropout", "f64_eval", [R(3, 4, dt="f64")], p=0.5, training=False)
    for red in ("mean", "sum", "none"):
        case("cross_entropy", "f32_" + red, [R(4, 5), I(4, lo=0, hi=5), None], ignore_index=-100,
             label_smoothing=0.0, reduction=red)
        case("cross_entropy", "f32_smoothing_" + red, [R(4, 5), I(4, lo=0, hi=5), None], ignore_index=-100,
             label_smoothing=0.2, reduction=red)
        case("cross_entropy", "f32_ignore_" + red, [R(4, 5), V([1, -100, 3, -100], dt="i64"), None],
             ignore_index=-100, label_smoothing=0.0, reduction=red)
        case("cross_entropy", "f32_probs_" + red, [R(3, 4), P(3, 4).nograd(), None], ignore_index=-100,
             label_smoothing=0.0, reduction=red)
    case("cross_entropy", "f64_ignore_smoothing", [R(4, 3, dt="f64"), V([0, 2, 2, 1], dt="i64"), None],
         ignore_index=2, label_smoothing=0.1, reduction="mean")
    case("cross_entropy", "f32_all_ignored", [R(2, 3), V([-100, -100], dt="i64"), None], ignore_index=-100,
         label_smoothing=0.0, reduction="mean")
    case("cross_entropy", "f32_spatial", [R(2, 3, 2, 2), I(2, 2, 2, lo=0, hi=3), None], ignore_index=-100,
         label_smoothing=0.0, reduction="mean")
    case("cross_entropy", "f32_i32_target", [R(3, 4), I(3, lo=0, hi=4, dt="i32"), None], ignore_index=-100,
         label_smoothing=0.0, reduction="mean")
    case("cross_entropy", "f32_probs_grad_smoothing", [R(3, 4), P(3, 4), None], ignore_index=-100,
         label_smoothing=0.3, reduction="mean")
    case("cross_entropy", "f32_transposed", [R(3, 5).T(), I(3, lo=0, hi=5), None], ignore_index=-100,
         label_smoothing=0.0, reduction="mean")
    case("cross_entropy", "f32_large_logits", [V([1000.0, 0.0, -1000.0, 0.0, 50.0, 50.0], [2, 3]),
                                               V([2, 0], dt="i64"), None], ignore_index=-100, label_smoothing=0.0,
         reduction="none")
    case("cross_entropy", "f32_weights", [R(4, 3), I(4, lo=0, hi=3), P(3).nograd()], ignore_index=-100,
         label_smoothing=0.0, reduction="mean")
    case("cross_entropy", "f64_weights_smoothing_ignore", [R(4, 3, dt="f64"), V([0, 2, -1, 1], dt="i64"),
                                                            P(3, dt="f64").nograd()],
         ignore_index=-1, label_smoothing=0.2, reduction="mean")
    case("cross_entropy", "f32_weights_probs", [R(3, 4), P(3, 4).nograd(), P(4).nograd()], ignore_index=-100,
         label_smoothing=0.0, reduction="sum")
    case("cross_entropy", "f32_weights_none_spatial", [R(2, 3, 4), I(2, 4, lo=0, hi=3), P(3).nograd()],
         ignore_index=-100, label_smoothing=0.1, reduction="none")
    case("cross_entropy", "f64_weights_all_ignored", [R(2, 3, dt="f64"), V([1, 1], dt="i64"), P(3, dt="f64").nograd()],
         ignore_index=1, label_smoothing=0.0, reduction="mean")
    for red in ("mean", "sum", "none"):
        case("nll_loss", "f32_" + red, [R(4, 5), I(4, lo=0, hi=5), None], ignore_index=-100, reduction=red)
    case("nll_loss", "f64_ignore", [R(4, 3, dt="f64"), V([0, 1, 1, 2], dt="i64"), None], ignore_index=1,
         reduction="mean")
    case("nll_loss", "f32_transposed", [R(3, 4).T(), I(3, lo=0, hi=4), None], ignore_index=-100, reduction="mean")
    case("nll_loss", "f32_weights", [R(4, 3), I(4, lo=0, hi=3), P(3).nograd()], ignore_index=-100,
         reduction="mean")
    case("nll_loss", "f64_weights_ignore_sum", [R(4, 3, dt="f64"), V([0, 1, 1, 2], dt="i64"),
                                                P(3, dt="f64").nograd()], ignore_index=1, reduction="sum")
    case("nll_loss", "f32_weights_none_i32", [R(4, 3), V([2, 0, 1, 2], dt="i32"), P(3).nograd()], ignore_index=0,
         reduction="none")
    for red in ("mean", "sum", "none"):
        case("mse_loss", "f32_" + red, [R(3, 4), R(3, 4)], reduction=red)
    case("mse_loss", "f64_views", [R(3, 4, dt="f64").T(), R(3, 4, dt="f64").bcast(0)], reduction="mean")
    case("mse_loss", "f32_special", [S(6), R(6)], reduction="sum")
    case("embedding", "f32", [I(2, 3, lo=0, hi=5), R(5, 3)])
    case("embedding", "f64_repeated_i32", [V([1, 1, 0, 1], dt="i32"), R(3, 2, dt="f64")])
    case("embedding", "f32_0dim_index", [I(lo=0, hi=4), R(4, 3)])
    case("embedding", "f32_transposed_weight", [I(3, lo=0, hi=4), R(3, 4).T()])
    case("embedding", "f32_padding_idx", [V([0, 2, 0, 1], dt="i64"), R(3, 2)], padding_idx=0)
    case("embedding", "f64_padding_idx_negative", [V([2, 2, 1], dt="i64"), R(3, 2, dt="f64")], padding_idx=-1)
    W = dict(sh=0, sw=0, ph=0, pw=0)
    for name in ("max_pool2d", "avg_pool2d"):
        case(name, "f32_2x2", [R(2, 3, 4, 4)], kh=2, kw=2, **W)
        case(name, "f64_3x3_stride1", [R(1, 2, 5, 5, dt="f64")], kh=3, kw=3, sh=1, sw=1, ph=0, pw=0)
        case(name, "f32_pad", [R(1, 1, 5, 5)], kh=3, kw=3, sh=2, sw=2, ph=1, pw=1)
        case(name, "f32_rect_overlap", [R(1, 2, 5, 6)], kh=2, kw=3, sh=1, sw=2, ph=0, pw=1)
        case(name, "f32_transposed", [R(1, 2, 4, 4).T()], kh=2, kw=2, **W)
        case(name, "f32_special", [S(1, 1, 4, 4)], kh=2, kw=2, **W)
        case(name, "f32_pad_negative_values", [P(1, 1, 3, 3, lo=-3.0, hi=-1.0)], kh=2, kw=2, sh=2, sw=2, ph=1, pw=1)
        case(name, "f32_floor_remainder", [R(1, 1, 5, 5)], kh=2, kw=2, **W)
    case("max_pool2d", "f32_ties", [V([1.0, 1.0, 0.0, 1.0] * 4, [1, 1, 4, 4])], kh=2, kw=2, sh=1, sw=1, ph=0, pw=0)
    case("max_pool2d", "f32_dilation", [R(1, 1, 6, 6)], kh=2, kw=2, sh=1, sw=1, ph=0, pw=0, dilation=2)
    case("max_pool2d", "f32_ceil_mode", [R(1, 2, 5, 5)], kh=2, kw=2, sh=2, sw=2, ph=0, pw=0, ceil_mode=True)
    case("avg_pool2d", "f32_exclude_pad", [R(1, 1, 5, 5)], kh=3, kw=3, sh=2, sw=2, ph=1, pw=1,
         count_include_pad=False)
    case("avg_pool2d", "f64_ceil_mode", [R(1, 2, 5, 5, dt="f64")], kh=2, kw=2, sh=2, sw=2, ph=0, pw=0,
         ceil_mode=True)
    case("avg_pool2d", "f32_divisor", [R(1, 1, 4, 4)], kh=2, kw=2, sh=2, sw=2, ph=0, pw=0, divisor_override=3)
    case("max_pool2d", "f64_dilation_pad_ceil", [R(1, 2, 7, 7, dt="f64")], kh=3, kw=2, sh=2, sw=3, ph=1, pw=1,
         dilation=2, ceil_mode=True)
    case("max_pool2d", "f32_ceil_mode_last_window_dropped", [R(1, 1, 5, 5)], kh=2, kw=2, sh=2, sw=2, ph=1, pw=1,
         ceil_mode=True)
    case("avg_pool2d", "f32_ceil_mode_pad_include", [R(1, 1, 5, 5)], kh=3, kw=3, sh=2, sw=2, ph=1, pw=1,
         ceil_mode=True, count_include_pad=True)
    case("avg_pool2d", "f32_ceil_mode_pad_exclude", [R(1, 2, 6, 5)], kh=3, kw=2, sh=2, sw=2, ph=1, pw=1,
         ceil_mode=True, count_include_pad=False)
    case("avg_pool2d", "f64_divisor_pad_transposed", [R(1, 1, 5, 4, dt="f64").T()], kh=3, kw=3, sh=1, sw=1, ph=1,
         pw=1, divisor_override=2)
    sd = "scaled_dot_product_attention"
    case(sd, "f32", [R(2, 3, 4), R(2, 5, 4), R(2, 5, 3)], causal=False, scale=0.0)
    case(sd, "f32_causal", [R(2, 4, 4), R(2, 4, 4), R(2, 4, 4)], causal=True, scale=0.0)
    case(sd, "f64_causal_heads", [R(1, 2, 3, 4, dt="f64"), R(1, 2, 3, 4, dt="f64"), R(1, 2, 3, 2, dt="f64")],
         causal=True, scale=0.0)
    case(sd, "f32_causal_rect", [R(3, 4), R(5, 4), R(5, 2)], causal=True, scale=0.5)
    case(sd, "f32_views", [R(2, 4, 3).T(), R(2, 5, 3).step(1), R(2, 5, 4).bcast(0)], causal=True, scale=0.0)
    case(sd, "f32_causal_more_queries", [R(5, 2), R(3, 2), R(3, 2)], causal=True, scale=0.0)
    case("one_hot", "i64", [I(2, 3, lo=0, hi=4)], n_classes=4)
    case("one_hot", "i32_0dim", [I(lo=0, hi=3, dt="i32")], n_classes=3)
    case("one_hot", "i64_transposed", [I(3, 2, lo=0, hi=5).T()], n_classes=5)
    case("one_hot", "i64_empty", [I(0)], n_classes=2)
    case("one_hot", "i64_out_of_range", [V([0, 3], dt="i64")], n_classes=3,
         expect_error="a class index out of range is refused, as in torch")
    case("masked_fill", "f32", [R(3, 4), B(3, 4)], value=-1.0)
    case("masked_fill", "f64_bcast_inf", [R(3, 4, dt="f64"), B(4)], value=-math.inf)
    case("masked_fill", "f32_views_nan", [R(3, 4).T(), B(3, 4).step(0)], value=math.nan)
    case("masked_fill", "i64", [I(3, 4), B(3, 1)], value=7.0)
    case("masked_fill", "f32_0dim_mask", [R(2, 3), V([1], [], dt="bool")], value=0.5)

    # optimizers, three steps
    sgd = dict(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)
    case("sgd", "plain_f32", [R(3, 4), R(3, 3, 4)], grad=False, **sgd)
    case("sgd", "momentum_dampening_f32", [R(3, 4), R(3, 3, 4)], grad=False, **dict(sgd, momentum=0.9, dampening=0.1))
    case("sgd", "nesterov_decay_f64", [R(5, dt="f64"), R(3, 5, dt="f64")], grad=False,
         **dict(sgd, momentum=0.8, weight_decay=0.01, nesterov=True))
    adamw = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, amsgrad=False)
    case("adamw", "default_f32", [R(3, 4), R(3, 3, 4)], grad=False, **adamw)
    case("adamw", "amsgrad_f64", [R(5, dt="f64"), R(4, 5, dt="f64")], grad=False,
         **dict(adamw, beta1=0.8, beta2=0.9, amsgrad=True))
    case("adamw", "no_decay_f32_transposed", [R(3, 4).T(), R(2, 3, 4)], grad=False, **dict(adamw, weight_decay=0.0))

    # multinomial (draws made certain, or their properties), clip_grad_norm_
    case("multinomial", "one_hot_rows", [V([0.0, 1.0, 0.0, 0.0, 0.0, 2.0], [2, 3], dt="f32")], num_samples=3,
         replacement=True, grad=False)
    case("multinomial", "without_replacement_full", [V([0.0, 1.0, 0.0], [3], dt="f64")], num_samples=1,
         replacement=False, grad=False)
    case("multinomial_properties", "f32_replacement_zeros", [V([0.0, 3.0, 0.0, 1.0, 0.5, 2.0, 0.0, 0.0, 1.0, 0.0],
                                                               [2, 5], dt="f32")], num_samples=40, replacement=True,
         grad=False)
    case("multinomial_properties", "f64_without_replacement_zeros",
         [V([0.5, 0.0, 2.0, 1.0, 0.0, 0.1, 0.0, 0.0, 1.0, 1.0, 3.0, 0.0, 4.0, 0.2, 0.3, 0.0, 0.0, 1.0], [3, 6],
            dt="f64")], num_samples=3, replacement=False, grad=False)
    case("multinomial_properties", "f32_without_replacement_every_class", [P(4, 8)], num_samples=8,
         replacement=False, grad=False)
    case("multinomial_properties", "f32_1d_without_replacement_all_nonzero", [V([1.0, 0.0, 2.0, 0.0, 0.5])],
         num_samples=3, replacement=False, grad=False)
    case("clip_grad_norm_", "clipped", [R(3, 4).nograd(), R(5).nograd()], max_norm=1.0, norm_type=2.0)
    case("clip_grad_norm_", "unclipped_inf_norm", [R(2, 2, dt="f64").nograd()], max_norm=100.0,
         norm_type=math.inf)
    case("clip_grad_norm_", "mixed_dtypes_l1", [R(3).nograd(), R(2, dt="f64").nograd()], max_norm=1.0, norm_type=1.0)
    case("clip_grad_norm_", "p3_transposed", [R(3, 4).T().nograd()], max_norm=0.5, norm_type=3.0)


# ---- writing -----------------------------------------------------------------------------------
def jnum(v):
    """JSON for an argument: floats that are not finite as strings, everything else as is."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (list, tuple)):
        return [jnum(x) for x in v]
    return v


def tol_pair(cls, dts):
    dt = "f64" if dts and all(d == "f64" for d in dts) else "f32"
    return list(TOL[cls][dt])


def save(root, t):
    """Writes t under the name of its content's hash (cases share equal arrays: inputs drawn from
    the same spec, upstream gradients of one shape) and returns that name."""
    arr = t.detach().contiguous().numpy()  # (np.ascontiguousarray would make a 0-dim array 1-dim)
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    data = buf.getvalue()
    name = hashlib.sha1(data).hexdigest()[:16] + ".npy"
    path = os.path.join(root, "data", name)
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(data)
    return name


def seed_of(*key):
    """A seed from what an array is (its spec and position), not from the case, so that equal
    specs share their data and adding a case changes no other."""
    return zlib.crc32(repr(key).encode())


def run_case(c, root):
    op = OPS[c["op"]]
    cid = c["op"] + "." + c["tag"]
    roles = op.roles if op.roles != "*" else tuple("x%d" % k for k in range(len(c["inputs"])))
    assert len(c["inputs"]) <= len(roles), cid
    ins, entries, leaves = {}, [], []
    for k, (role, spec) in enumerate(zip(roles, c["inputs"])):
        if spec is None:
            continue
        g = torch.Generator().manual_seed(seed_of(k, spec.gen, spec.dt, spec.base, spec.lo, spec.hi, spec.values))
        base = make_base(spec, g)
        fname = save(root, base)
        t = apply_view(base, spec.view)
        wants_grad = c["grad"] and spec.grad and spec.dt in FLOAT
        if wants_grad:
            t = t.detach().requires_grad_(True)
            leaves.append(t)
        ins[role] = t
        entries.append({"name": role, "file": fname, "view": spec.view, "grad": wants_grad})
    try:
        outs = op.fn(ins, c["args"])
    except (RuntimeError, IndexError, ValueError) as e:
        if not c["expect_error"] or c["error_device"]:
            raise RuntimeError("case %s: PyTorch fails: %s" % (cid, e)) from e
        outs = ()  # PyTorch refuses it too: the case checks that Ember does
    outs = outs if isinstance(outs, tuple) else (outs,)
    dts = [s.dt for s in c["inputs"] if s is not None and s.dt in FLOAT] or \
        [{torch.float32: "f32", torch.float64: "f64"}.get(o.dtype, "f32") for o in outs]
    out_entries, diff_outs, seeds = [], [], []
    for j, o in enumerate(outs):
        fname = save(root, o)
        gname = None
        if o.requires_grad and leaves:
            g = torch.Generator().manual_seed(seed_of("grad_out", j, list(o.shape)))
            seed = torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)
            gname = save(root, seed)
            diff_outs.append(o)
            seeds.append(seed)
        out_entries.append({"file": fname, "grad_out": gname})
    grads = []
    if diff_outs:
        gs = torch.autograd.grad(diff_outs, leaves, seeds, allow_unused=True)
        gi = iter(gs)
    for e in entries:
        if e["grad"] and diff_outs:
            g = next(gi)
            leaf = ins[e["name"]]
            g = torch.zeros_like(leaf) if g is None else g
            grads.append(save(root, g))
        else:
            e["grad"] = False
            grads.append(None)
    tol = c["tol"] or op.tol
    gtol = c["grad_tol"] or looser(tol, op.grad_tol)
    m = {"id": cid, "op": c["op"], "args": {k: jnum(v) for k, v in c["args"].items()}, "inputs": entries,
         "outputs": out_entries, "grads": grads, "tol": {"out": tol_pair(tol, dts), "grad": tol_pair(gtol, dts)}}
    if c["expect_error"]:
        m["expect_error"] = c["expect_error"]
    if c["error_device"]:
        m["expect_error_device"] = c["error_device"]
    return m


def generate(root, include_pending=False):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    data = os.path.join(root, "data")
    if os.path.isdir(data):
        shutil.rmtree(data)
    os.makedirs(data)
    CASES.clear()
    add_pointwise()
    add_reductions()
    add_movement()
    add_extern()
    add_nn()
    unknown = {c["pending"] for c in CASES if c["pending"]} - set(PENDING_OPS)
    assert not unknown, "cases name features missing from PENDING_OPS: %s" % sorted(unknown)
    seen, lines, pending = set(), [], 0
    for c in CASES:
        if c["pending"] in PENDING_OPS and not include_pending:
            pending += 1
            continue
        m = run_case(c, root)
        assert m["id"] not in seen, "duplicate case id " + m["id"]
        seen.add(m["id"])
        lines.append(json.dumps(m, separators=(",", ":"), allow_nan=False))
    with open(os.path.join(root, "manifest.json"), "w", newline="\n") as f:
        f.write('{"version":1,"torch":"%s","cases":[\n' % torch.__version__.split("+")[0])
        f.write(",\n".join(lines))
        f.write("\n]}\n")
    return len(lines), pending


def main():
    if "--check" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            generate(tmp)
            bad = []
            for rel in ["manifest.json"] + sorted("data/" + n for n in os.listdir(os.path.join(tmp, "data"))):
                a, b = os.path.join(tmp, rel), os.path.join(HERE, rel)
                if not os.path.exists(b) or open(a, "rb").read() != open(b, "rb").read():
                    bad.append(rel)
            extra = set(os.listdir(os.path.join(HERE, "data"))) - set(os.listdir(os.path.join(tmp, "data")))
            bad += sorted("data/" + n for n in extra)
            print("%d files differ%s" % (len(bad), (": " + " ".join(bad[:10])) if bad else ""))
            sys.exit(1 if bad else 0)
    if "--with-pending" in sys.argv:  # the pending cases too, into another directory, to try them
        root = sys.argv[sys.argv.index("--with-pending") + 1]
        os.makedirs(root, exist_ok=True)
        n, _ = generate(root, include_pending=True)
        print("wrote %d cases, pending ones included, into %s" % (n, root))
        return
    n, pending = generate(HERE)
    print("wrote %d cases (%d pending cases not written: PENDING_OPS)" % (n, pending))


if __name__ == "__main__":
    main()
