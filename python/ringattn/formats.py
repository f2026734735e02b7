"""How q, k, v, o, do and the gradients hold their dimensions: `qkv_format`, by TransformerEngine's names (the
CLI's --qkv-format). The core takes (batch, len, heads, dim), "bshd"; "bhsd" (PyTorch's
scaled_dot_product_attention) and "sbhd" (Megatron's, TransformerEngine's default) cross as views of it, their
axes moved on the way in and back on the way out (the core reads views through their strides: no copies).
Masks, biases, segment ids and lse are (batch, heads, ...) in every format."""

import warnings

from . import _core

# Each format's axes as (B, L, H, X) takes them; each permutation is its own inverse.
_AXES = {"bshd": None, "bhsd": (0, 2, 1, 3), "sbhd": (1, 0, 2, 3)}
_DIMS = {"bshd": "(batch, len, heads, dim)", "bhsd": "(batch, heads, len, dim)", "sbhd": "(len, batch, heads, dim)"}


def axes_of(qkv_format):
    """The axes that take a tensor of `qkv_format` to (B, L, H, X) and back (None: bshd, nothing to move)."""
    if qkv_format is None:
        return None
    if qkv_format not in _AXES:
        raise ValueError("qkv_format %r is none of 'bshd' %s, 'bhsd' %s: PyTorch's scaled_dot_product_attention, "
                         "'sbhd' %s: Megatron's, TransformerEngine's default (packed sequences, FlashAttention's thd, "
                         "go as segment_ids, or through ringattn.torch.attention_varlen)" %
                         (qkv_format, _DIMS["bshd"], _DIMS["bhsd"], _DIMS["sbhd"]))
    return _AXES[qkv_format]


def to_core(qkv_format, named):
    """The axes of `qkv_format` (axes_of) and the arrays of `named` ((name, array), ...), each refused by name where
    it is no array, as the core's (B, L, H, X) views."""
    axes = axes_of(qkv_format)
    return axes, [reorder(expect_array(x, name), axes, name) for name, x in named]


def reorder(x, axes, name):
    """x's view with its axes moved by `axes` (None: x itself). Any framework: PyTorch's permute, else transpose
    (numpy, JAX, CuPy)."""
    if x is None or axes is None:
        return x
    if len(x.shape) != 4:
        raise ValueError("%s has %d dimensions %s: a qkv_format reorders 4" % (name, len(x.shape), tuple(x.shape)))
    return x.permute(axes) if type(x).__module__.startswith("torch") else x.transpose(axes)


def expect_array(x, name):
    """x, refused by name where it is no array (the core's own refusal names no argument)."""
    if not hasattr(x, "__dlpack__"):
        raise ValueError("%s is a %s, expected an array (numpy, PyTorch, JAX or CuPy: anything with __dlpack__)" %
                         (name, type(x).__name__))
    return x


def explained(qkv_format, call):
    """call(), its ValueError saying in which order it names q's, k's, v's, o's and do's dimensions."""
    if axes_of(qkv_format) is None:
        return call()
    try:
        return call()
    except ValueError as error:
        raise ValueError("%s (qkv_format %r: shapes named as (batch, len, heads, dim), the tensors' %s reordered)" %
                         (error, qkv_format, _DIMS[qkv_format])) from error


def note_layout(q, k, qkv_format):
    """A warning where q and k given without a qkv_format look like another one (the CLI's rule, in the core):
    a (batch, heads, len, dim) q read as more heads than any model has and more than its tokens; (len, batch,
    ...) ones read as batch rows of one query and one key (whose output is v)."""
    if qkv_format is not None or len(q.shape) != 4 or len(k.shape) != 4:
        return
    batch, q_len, heads = q.shape[:3]
    likely = _core.likely_misread_format(int(batch), int(q_len), int(heads), int(k.shape[1]))
    if likely == "bhsd":
        warnings.warn("q %s read as (batch, len, heads, dim) has %d heads and %d tokens: if it holds (batch, heads, "
                      "len, dim), as PyTorch's scaled_dot_product_attention takes it, pass qkv_format='bhsd'" %
                      (tuple(q.shape), heads, q_len), stacklevel=3)
    elif likely == "sbhd":
        warnings.warn("q %s and k %s read as (batch, len, heads, dim) are %d batch rows of one query and one key "
                      "(their output is v): if they hold (len, batch, heads, dim), pass qkv_format='sbhd'" %
                      (tuple(q.shape), tuple(k.shape), batch), stacklevel=3)
